package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/clients"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	_ "github.com/sluicehq/sluice/identity/jwt" // the jwt identity source, which decision.NewPolicies builds
	"github.com/sluicehq/sluice/rls/envoyconf"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

func newCheckCommand() *cobra.Command {
	var path string
	var registry, schema bool
	cmd := &cobra.Command{
		Use:   "check --config FILE [--registry] | check --schema",
		Short: "check a configuration as serve would read it, without listening or connecting to the store",
		Long: `Check the configuration FILE (else the file SLUICE_CONFIG names) as sluice serve would start
on it, and print "FILE: ok" and what it runs; or every error with its file and line, as serve
prints them, and exit with code 2. It reads the Envoy files of an rls section, the tls
certificate and key, and the identity sources' secrets (a jwt source's secret_env, say), with
SLUICE_LISTEN and SLUICE_ADMIN_LISTEN over the file's listen and admin_listen, as serve does.
It opens no listener and does not connect to Redis.

With --registry it also reads the clients API's records (from the Redis the file names, or from
admin.clients_file) and prints what would run of them with this file: the file's clients they
replace (the API's wins when both name a client) and those that could not run, with why.

With --schema it prints the configuration's JSON Schema (draft-07) instead, for editors and
other checkers: every field of every section, their shapes and enumerated values (the Helm
chart's values.schema.json embeds it). A file it accepts may still fail the check: ranges,
references and the rules between fields are the check's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if schema {
				if cmd.Flags().Changed("config") || registry {
					return errors.New("--schema prints the schema alone: no --config or --registry with it")
				}
				if _, err := cmd.OutOrStdout().Write(config.JSONSchema()); err != nil {
					return failure{err}
				}
				return nil
			}
			path := configPath(cmd, path)
			if path == "" {
				return fmt.Errorf("check needs the configuration: --config FILE or %s (see sluice check --help)", envConfig)
			}
			o, err := readOverrides(cmd)
			if err != nil {
				return err
			}
			cfg, err := check(path, o)
			if err != nil {
				return configError{err}
			}
			if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n%s\n", path, cfg.String()); err != nil {
				return failure{err}
			}
			return checkRegistry(cmd.OutOrStdout(), cfg, registry)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "the YAML configuration `FILE` (default $"+envConfig+")")
	cmd.Flags().BoolVar(&schema, "schema", false, "print the configuration's JSON Schema and exit")
	cmd.Flags().BoolVar(&registry, "registry", false, "also read the clients API's records (from Redis, or admin.clients_file) and say what would run of them with this file")
	return cmd
}

// checkRegistry says which wins when the file and the clients API name one client, and, with
// read, reads the API's records from the store the file names (Redis, or admin.clients_file) and
// says what would run of them with this file: the file's clients they replace, those that could
// not run and why.
func checkRegistry(w io.Writer, cfg *config.Config, read bool) error {
	if !read {
		_, err := fmt.Fprintf(w, "clients: %d in the file; a client the clients API also names runs as the API's (--registry reads the API's records)\n", len(cfg.Clients))
		return err
	}
	var b clients.Backend
	if cfg.Store.Type == config.StoreRedis {
		rs, err := redisstore.New(redisOptions(cfg.Store, slog.New(slog.DiscardHandler)))
		if err != nil {
			return failure{fmt.Errorf("--registry: %w", err)}
		}
		defer rs.Close()
		b = rs.Registry()
	} else {
		if cfg.Admin.ClientsFile == "" {
			_, err := fmt.Fprintf(w, "clients: %d in the file; the memory store keeps the clients API's records in the running process only (no admin.clients_file): nothing to read\n", len(cfg.Clients))
			return err
		}
		mb, err := clients.ReadMemoryBackend(cfg.Admin.ClientsFile)
		if err != nil {
			return failure{fmt.Errorf("--registry: %w", err)}
		}
		defer mb.Close()
		b = mb
	}
	m := clients.NewManager(b, 0, nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := m.Sync(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return failure{fmt.Errorf("--registry: the store did not answer: %w", err)}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := m.Merge(cfg); err != nil {
		return failure{fmt.Errorf("--registry: %w", err)}
	}
	st := m.Status()
	fmt.Fprintf(w, "clients: %d from the file, %d from the clients API (registry version %d); the API's wins when both name one\n", st.FromFile, st.FromAPI, st.Version)
	if len(st.Shadowed) > 0 {
		fmt.Fprintf(w, "  the file's clients the API's replace: %s\n", strings.Join(st.Shadowed, ", "))
	}
	for _, name := range slices.Sorted(maps.Keys(st.Dropped)) {
		fmt.Fprintf(w, "  not running: %s: %s\n", name, st.Dropped[name])
	}
	if st.Expired > 0 {
		fmt.Fprintf(w, "  expired: %d\n", st.Expired)
	}
	return nil
}

// check reads the configuration at path and everything else serve would read of it at the
// start, short of listening and opening the store; its errors are joined, one per line.
func check(path string, o overrides) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	var errs []error
	if err := o.apply(cfg); err != nil {
		errs = append(errs, err)
	}
	if _, err := decision.NewPolicies(cfg); err != nil {
		errs = append(errs, err)
	}
	if cfg.Listen != "" && cfg.TLS != nil {
		if _, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("%s: tls: %w", cfg.File, err))
		}
	}
	if cfg.RLS != nil {
		if _, err := envoyconf.Load(cfg.RLS.EnvoyConfig...); err != nil {
			errs = append(errs, err)
		}
	}
	return cfg, errors.Join(errs...)
}
