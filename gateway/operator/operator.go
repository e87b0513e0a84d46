// Package operator is the gateway's live operator page: which client is being limited right now,
// every client's allowed, refused and delayed rates, early retries, and the store's health and
// fallback state, and what each client needs beside its limits. It is a static page (embedded)
// that reads the admin listener's GET /v1/history first (its chart opens with the last hour),
// then polls GET /v1/stats, and every 10 s GET /v1/clients/{name}/needs of
// the clients it lists (and again for a what-if).
package operator

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Handler serves the page; mount it under a prefix with http.StripPrefix. The page fetches
// "../v1/stats" relative to itself, so it must be mounted one level below the stats endpoint's
// parent (sluice serves it at /operator/ beside /v1/stats).
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
