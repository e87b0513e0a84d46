package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/web"
)

const webLong = `Serve the browser simulation: the five algorithms side by side on the same traffic, on a
virtual clock, with plots and a summary that is, number for number, sluice simulate --compare's.
The page runs sluice's own Go code compiled to WebAssembly; the server only hands out its files
(gzipped when the browser accepts it), and the page sends nothing back.

--listen ADDR serves only the page (default 127.0.0.1:9090). SIGINT or SIGTERM stop the server.
--export DIR writes the page as a static folder instead: any static file host serves it as it is
(relative links, no server logic), e.g. python3 -m http.server --directory DIR. The folder also
holds a .gz beside each file, for hosts that serve those (nginx gzip_static).

sluice serve also serves the page, on its admin listener at /.`

const webExample = `  sluice web                          # then open http://127.0.0.1:9090/
  sluice web --listen 127.0.0.1:8000
  sluice web --export site/ && python3 -m http.server --directory site/`

func newWebCommand() *cobra.Command {
	var listen, export string
	cmd := &cobra.Command{
		Use:     "web [--listen ADDR | --export DIR]",
		Short:   "Serve the browser simulation, or write it out as a static folder",
		Long:    webLong,
		Example: webExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("web takes no arguments, got %q (a folder goes after --export)", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			switch {
			case flags.Changed("listen") && flags.Changed("export"):
				return errors.New("--listen and --export exclude each other: serve the page, or write it out")
			case flags.Changed("export"):
				return exportWeb(export, cmd.OutOrStdout())
			}
			return serveWeb(cmd.Context(), listen, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9090", "the `ADDR` (host:port) to serve the page on; port 0 picks a free one")
	f.StringVar(&export, "export", "", "write the page into the folder `DIR` (created if missing) instead of serving it")
	f.SortFlags = false
	return cmd
}

func exportWeb(dir string, stdout io.Writer) error {
	if dir == "" {
		return errors.New("--export: want a folder, e.g. --export site/")
	}
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("--export %s: not a folder", dir)
	}
	if err := web.Export(dir); err != nil {
		return failure{err}
	}
	if _, err := fmt.Fprintf(stdout, "sluice web: wrote the page to %s (%d files, and their .gz); serve it with any static file host, e.g.\n  python3 -m http.server --directory %s\n",
		dir, len(web.Files()), dir); err != nil {
		return failure{err}
	}
	return nil
}

// serveWeb serves the page on addr until SIGINT, SIGTERM or ctx's end.
func serveWeb(ctx context.Context, addr string, stdout io.Writer) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--listen %s: want host:port, e.g. 127.0.0.1:9090 (%v)", addr, err)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return failure{fmt.Errorf("--listen %s: %w", addr, err)}
	}
	srv := &http.Server{Handler: web.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(ln) }()
	if _, err := fmt.Fprintf(stdout, "sluice web: the simulation is at http://%s/ (Ctrl-C stops)\n", ln.Addr()); err != nil {
		srv.Close()
		return failure{err}
	}
	select {
	case err := <-errs:
		return failure{err}
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	}
}
