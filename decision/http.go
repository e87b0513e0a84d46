package decision

import (
	"net/http"
	"time"

	"github.com/sluicehq/sluice/answer"
)

// Serve is the one net/http front end: it answers r by v, a Verdict of it. A request that passes
// is held for v.Hold (unless the client leaves first) and then served by next, its answer
// carrying the RateLimit fields; one that does not is answered with v.Problem and the fields.
// legacy also sends X-RateLimit-Limit, -Remaining and -Reset. It reports false for a request
// whose client left while it was held (next was not called). It releases v.
//
// The gateway's net/http engine (next: the reverse proxy) and package middleware (next: the
// limited handler) both answer through it.
func Serve(w http.ResponseWriter, r *http.Request, v *Verdict, legacy bool, next http.Handler) bool {
	if !v.Passes() {
		answer.Headers(w.Header(), v.Decisions, legacy)
		v.Release()
		answer.WriteProblem(w, v.Problem)
		return true
	}
	if len(v.Decisions) > 0 {
		// The fields go on the final answer: a handler (ReverseProxy, say) may clear the header
		// after passing on a 1xx (100 Continue), so fields set now would be lost.
		var h http.Header = make(http.Header, 4)
		answer.Headers(h, v.Decisions, legacy)
		w = &fieldsWriter{ResponseWriter: w, fields: h}
	}
	hold := v.Hold
	v.Release() // the fields are formatted
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client left while held: do not serve it
			t.Stop()
			return false
		}
	}
	next.ServeHTTP(w, r)
	return true
}

// fieldsWriter adds fields to the response's header when its status is final (not 1xx).
type fieldsWriter struct {
	http.ResponseWriter
	fields http.Header
	done   bool
}

func (f *fieldsWriter) add() {
	if !f.done {
		f.done = true
		h := f.ResponseWriter.Header()
		for k, vs := range f.fields {
			h[k] = append(h[k], vs...)
		}
	}
}

func (f *fieldsWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		f.add()
	}
	f.ResponseWriter.WriteHeader(code)
}

func (f *fieldsWriter) Write(b []byte) (int, error) {
	f.add() // an implicit 200
	return f.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (which ReverseProxy uses to flush and to hijack for an
// upgrade) reach the server's writer.
func (f *fieldsWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }
