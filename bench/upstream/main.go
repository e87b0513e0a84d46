// Command upstream is the load benchmark's backend (scripts/bench-gateway.sh): it answers every
// request 200 with a small fixed body, over keep-alive connections, and does nothing else, so
// that what the benchmark measures in front of it is the proxy's cost.
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"time"
)

var body = []byte(`{"ok":true}` + "\n")

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "the `ADDR` to listen on")
	flag.Parse()
	length := strconv.Itoa(len(body))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Drain any request body so the connection can be reused.
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{length}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	})
	srv := &http.Server{Addr: *listen, Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
