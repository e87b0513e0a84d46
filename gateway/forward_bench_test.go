package gateway

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkForward is a whole forwarded request on the fasthttp engine over loopback: a client,
// sluice's handler on a fasthttp server (memory store, one token-bucket policy that refuses
// nothing) and an upstream like bench/upstream (net/http, 200 with a short JSON body).
func BenchmarkForward(b *testing.B) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	// The upstream is bench/upstream's: net/http, a small JSON body with its length.
	body := []byte(`{"ok":true}` + "\n")
	upSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	})}
	go upSrv.Serve(upLn)
	defer upSrv.Close()
	addr := benchListen(b, benchServer(b, "http://"+upLn.Addr().String()))
	c := &fasthttp.HostClient{Addr: addr, MaxConns: 64}
	url := "http://" + addr + "/orders"
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(url)
		req.Header.Set("X-API-Key", "bench-key")
		for pb.Next() {
			if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				b.Fatal(err, resp.StatusCode())
			}
		}
	})
}
