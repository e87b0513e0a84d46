package main

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	_ "github.com/sluicehq/sluice/identity/jwt" // the jwt identity source, which decision.NewPolicies builds
	"github.com/sluicehq/sluice/rls/envoyconf"
)

func newCheckCommand() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "check --config FILE",
		Short: "check a configuration as serve would read it, without listening or connecting to the store",
		Long: `Check the configuration FILE (else the file SLUICE_CONFIG names) as sluice serve would start
on it, and print "FILE: ok" and what it runs; or every error with its file and line, as serve
prints them, and exit with code 2. It reads the Envoy files of an rls section, the tls
certificate and key, and the identity sources' secrets (a jwt source's secret_env, say), with
SLUICE_LISTEN and SLUICE_ADMIN_LISTEN over the file's listen and admin_listen, as serve does.
It opens no listener and does not connect to Redis.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
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
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "the YAML configuration `FILE` (default $"+envConfig+")")
	return cmd
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
