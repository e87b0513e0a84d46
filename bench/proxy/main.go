// Command proxy is a bare reverse proxy, with no limiting, for the gateway benchmark: the
// candidate engines measured side by side with sluice (scripts/bench-gateway.sh), so that the
// engine is chosen on numbers.
//
//	proxy -engine nethttp|hybrid|fasthttp -listen 127.0.0.1:8081 -upstream 127.0.0.1:8080
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"

	"github.com/valyala/fasthttp"
)

func main() {
	engine := flag.String("engine", "nethttp", "nethttp (httputil.ReverseProxy), hybrid (a net/http server forwarding with a fasthttp HostClient) or fasthttp (a fasthttp server and HostClient)")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	upstream := flag.String("upstream", "", "the upstream's host:port")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("proxy: -upstream is required")
	}
	switch *engine {
	case "nethttp":
		target := &url.URL{Scheme: "http", Host: *upstream}
		pool := &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
		rp := &httputil.ReverseProxy{
			Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.SetXForwarded() },
			Transport:  &http.Transport{MaxIdleConnsPerHost: 256},
			BufferPool: pool,
		}
		log.Fatal(http.ListenAndServe(*listen, rp))
	case "fasthttp":
		hc := &fasthttp.HostClient{Addr: *upstream, MaxConns: 1024}
		handler := func(ctx *fasthttp.RequestCtx) {
			req, resp := &ctx.Request, &ctx.Response
			req.Header.Del("Connection")
			req.Header.Add("X-Forwarded-For", ctx.RemoteIP().String())
			if err := hc.Do(req, resp); err != nil {
				ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
			}
			resp.Header.Del("Connection")
		}
		log.Fatal(fasthttp.ListenAndServe(*listen, handler))
	case "hybrid":
		hc := &fasthttp.HostClient{Addr: *upstream, MaxConns: 1024}
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.Header.SetMethod(r.Method)
			req.SetRequestURI(r.URL.RequestURI())
			req.Header.SetHost(r.Host)
			for k, vs := range r.Header {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			req.Header.Add("X-Forwarded-For", r.RemoteAddr)
			if r.ContentLength != 0 {
				req.SetBodyStream(r.Body, int(r.ContentLength))
			}
			if err := hc.Do(req, resp); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			h := w.Header()
			for k, v := range resp.Header.All() {
				h.Add(string(k), string(v))
			}
			w.WriteHeader(resp.StatusCode())
			_, _ = w.Write(resp.Body())
		})
		log.Fatal(http.ListenAndServe(*listen, handler))
	default:
		log.Fatalf("proxy: unknown engine %q", *engine)
	}
}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }
