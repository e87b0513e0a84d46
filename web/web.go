// Package web is sluice's browser simulation: a page that runs the five algorithms side by side on
// the same traffic, on a virtual clock, with sluice's own Go code compiled to WebAssembly
// (web/wasm). The page is static; this package embeds it, serves it (Handler) and writes it out
// for any static file host (Export). See web/README.md.
//
// The assets in web/assets are built by scripts/build-web.sh (go generate ./web) and committed, so
// that the binary builds without Node.js; scripts/check-web.sh checks they are up to date.
package web

//go:generate bash ../scripts/build-web.sh

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

//go:embed assets
var embedded embed.FS

// assets is the page's folder: index.html at its root.
var assets = func() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic("web: the embedded assets have no assets folder: " + err.Error()) // go:embed guarantees it
	}
	return sub
}()

// contentTypes are the types of the page's files, fixed here rather than read from the system's
// MIME tables, which differ between machines (a wrong type for .wasm or .js breaks the page).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".wasm": "application/wasm",
	".svg":  "image/svg+xml",
	".txt":  "text/plain; charset=utf-8",
}

// ContentType returns the Content-Type the page's file name is served with.
func ContentType(name string) string {
	if t, ok := contentTypes[path.Ext(name)]; ok {
		return t
	}
	return "application/octet-stream"
}

// file is one asset, with its gzip form made on first use and kept: the assets never change
// while the process runs.
type file struct {
	name string
	data []byte
	etag string // a strong validator of data: the first 16 bytes of its SHA-256, in hex

	gzipOnce sync.Once
	gz       []byte // data gzipped, or nil if that is not smaller
}

func (f *file) gzipped() []byte {
	f.gzipOnce.Do(func() {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression) // a valid level: no error
		zw.Write(f.data)                                       // a bytes.Buffer does not fail
		zw.Close()
		if b.Len() < len(f.data) {
			f.gz = b.Bytes()
		}
	})
	return f.gz
}

var (
	filesOnce sync.Once
	files     map[string]*file // by path in assets ("index.html", "sluice.wasm")
)

func loadFiles() map[string]*file {
	filesOnce.Do(func() {
		files = map[string]*file{}
		err := fs.WalkDir(assets, ".", func(name string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := fs.ReadFile(assets, name)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			files[name] = &file{name: name, data: data, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
			return nil
		})
		if err != nil {
			panic("web: reading the embedded assets: " + err.Error()) // an embed.FS does not fail
		}
	})
	return files
}

// Files returns the names of the page's files, sorted: index.html, app.js, sluice.wasm, ...
func Files() []string {
	var names []string
	for name := range loadFiles() {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Handler serves the page at the root of wherever it is mounted: "/" is index.html, and the page
// refers to its other files by relative URLs, so it also works under a prefix stripped with
// http.StripPrefix. It answers GET and HEAD (405 otherwise) and 404 for anything that is not one
// of the page's files. A client that accepts gzip gets it (compressed once, then kept), with the
// same Content-Type. Every answer carries an ETag and "Cache-Control: no-cache", so a browser
// revalidates and a new sluice's page is never mixed with an old one's cached files.
//
// The page makes no request to any server but this one for its own files: the simulation runs
// in the browser.
func Handler() http.Handler {
	byName := loadFiles()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		if name == "" {
			name = "index.html"
		}
		f, ok := byName[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "405 method not allowed: the page answers GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", ContentType(name))
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if path.Ext(name) == ".html" {
			h.Set("Content-Security-Policy", contentSecurityPolicy)
			h.Set("X-Frame-Options", "DENY")
		}
		data, etag := f.data, f.etag
		if gz := f.gzipped(); gz != nil {
			h.Add("Vary", "Accept-Encoding")
			if acceptsGzip(r) {
				data, etag = gz, f.etag[:len(f.etag)-1]+`-gzip"`
				h.Set("Content-Encoding", "gzip")
			}
		}
		h.Set("ETag", etag)
		if matchesETag(r.Header.Get("If-None-Match"), etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		// No ranges: the largest file is a few MB, fetched whole by the page.
		h.Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write(data) //nolint:errcheck // the client went away: nothing to do
		}
	})
}

// matchesETag reports whether an If-None-Match field lists etag (or is "*"); a weak validator
// W/"x" matches "x", as the weak comparison of RFC 9110 says for If-None-Match.
func matchesETag(field, etag string) bool {
	for _, v := range strings.Split(field, ",") {
		v = strings.TrimPrefix(strings.TrimSpace(v), "W/")
		if v == etag || v == "*" {
			return true
		}
	}
	return false
}

// contentSecurityPolicy is index.html's policy as a header too (the file carries it in a meta
// element for static hosts): the page's own files only, and WebAssembly compilation.
const contentSecurityPolicy = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// acceptsGzip reports whether r's Accept-Encoding allows gzip (listed, and not with q=0).
func acceptsGzip(r *http.Request) bool {
	for _, field := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(field, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			coding = strings.ToLower(strings.TrimSpace(coding))
			if coding != "gzip" && coding != "x-gzip" && coding != "*" {
				continue
			}
			q := strings.ReplaceAll(strings.ToLower(params), " ", "")
			if q == "q=0" || q == "q=0.0" || q == "q=0.00" || q == "q=0.000" {
				return false
			}
			return true
		}
	}
	return false
}

// Export writes the page into dir (created if missing) as a static folder that any static file
// host serves: the files of Files, and beside each that compresses, its gzip form (name.gz) for
// hosts that serve those to clients that accept gzip (nginx's gzip_static). The page works
// from the plain files alone. Export overwrites the page's files in dir and leaves others alone.
func Export(dir string) error {
	if dir == "" {
		return errors.New("web: export: no folder given")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("web: export: %w", err)
	}
	for _, name := range Files() {
		f := files[name]
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("web: export: %w", err)
		}
		if err := os.WriteFile(dst, f.data, 0o644); err != nil {
			return fmt.Errorf("web: export: %w", err)
		}
		if gz := f.gzipped(); gz != nil {
			if err := os.WriteFile(dst+".gz", gz, 0o644); err != nil {
				return fmt.Errorf("web: export: %w", err)
			}
		}
	}
	return nil
}
