package browsertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var cli struct {
	once sync.Once
	path string
	err  error
}

// SluiceBinary builds cmd/sluice once per test binary, for the tests that run the commands a page
// shows (sluice simulate ...) and compare their output with the page's. Call RemoveSluiceBinary
// from TestMain once the tests are done.
func SluiceBinary(tb testing.TB) string {
	tb.Helper()
	cli.once.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-page-cli")
		if err != nil {
			cli.err = err
			return
		}
		cli.path = filepath.Join(dir, "sluice")
		out, err := exec.Command("go", "build", "-o", cli.path, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput()
		if err != nil {
			cli.err = &exec.Error{Name: "go build ./cmd/sluice: " + string(out), Err: err}
		}
	})
	if cli.err != nil {
		tb.Fatal(cli.err)
	}
	return cli.path
}

// RemoveSluiceBinary removes what SluiceBinary built, if it built anything.
func RemoveSluiceBinary() {
	if cli.path != "" {
		os.RemoveAll(filepath.Dir(cli.path))
	}
}

// ShellWords splits a command line as the pages (and web/scenario's shellQuote) quote it: words
// separated by spaces, '...' quoted, a backslash outside quotes escaping the next character.
func ShellWords(line string) []string {
	var words []string
	var w strings.Builder
	in, started := false, false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\'':
			in, started = !in, true
		case c == '\\' && !in && i+1 < len(line):
			i++
			w.WriteByte(line[i])
		case c == ' ' && !in:
			if started || w.Len() > 0 {
				words = append(words, w.String())
			}
			w.Reset()
			started = false
		default:
			w.WriteByte(c)
		}
	}
	if started || w.Len() > 0 {
		words = append(words, w.String())
	}
	return words
}
