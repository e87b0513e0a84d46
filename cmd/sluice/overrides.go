package main

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
)

// The environment variables serve and check read when their flags are not given.
const (
	envConfig      = "SLUICE_CONFIG"       // the configuration file (--config)
	envListen      = "SLUICE_LISTEN"       // listen (--listen)
	envAdminListen = "SLUICE_ADMIN_LISTEN" // admin_listen (--admin-listen)
)

// override is one listen address given outside the file: by a flag or an environment variable
// (from names which, for the errors).
type override struct {
	addr string
	from string // "--listen", "SLUICE_LISTEN", ...
}

// overrides are the listen addresses the command line and the environment put over the file's:
// a flag beats its variable, which beats the file. nil: the file's.
type overrides struct {
	listen, admin *override
}

// configPath is the configuration file: --config if given, else SLUICE_CONFIG ("" for neither,
// or an empty variable: the demo for serve).
func configPath(cmd *cobra.Command, flag string) string {
	if cmd.Flags().Changed("config") {
		return flag
	}
	return os.Getenv(envConfig)
}

// readOverrides takes the addresses of the flags listen and admin-listen (when cmd has them and
// they were given) or else of the variables. An empty variable counts as not set (a flag's ""
// turns its listener off, as the file's "" does). A bad address is an error naming its flag or
// variable.
func readOverrides(cmd *cobra.Command) (overrides, error) {
	var o overrides
	var err error
	if o.listen, err = readOverride(cmd, "listen", envListen); err != nil {
		return o, err
	}
	if o.admin, err = readOverride(cmd, "admin-listen", envAdminListen); err != nil {
		return o, err
	}
	if o.listen != nil && o.admin != nil && o.admin.addr != "" && o.admin.addr == o.listen.addr {
		return o, fmt.Errorf("%s %q is also %s; give them different ports", o.admin.from, o.admin.addr, o.listen.from)
	}
	return o, nil
}

func readOverride(cmd *cobra.Command, flag, env string) (*override, error) {
	var o *override
	if f := cmd.Flags().Lookup(flag); f != nil && f.Changed {
		o = &override{addr: f.Value.String(), from: "--" + flag}
	} else if v := os.Getenv(env); v != "" {
		o = &override{addr: v, from: env}
	}
	if o == nil || o.addr == "" { // only a flag can be ""
		return o, nil
	}
	// The file's rule (config's listen and admin_listen): host:port, port 0 to 65535.
	_, port, err := net.SplitHostPort(o.addr)
	if err != nil {
		return nil, fmt.Errorf("%s %q is not host:port (e.g. 127.0.0.1:8080, :8080)", o.from, o.addr)
	}
	if v, err := strconv.ParseUint(port, 10, 16); err != nil || (v == 0 && port != "0") {
		return nil, fmt.Errorf("%s %q: port %q must be a number from 0 to 65535", o.from, o.addr, port)
	}
	return o, nil
}

// apply puts the overrides over cfg's addresses, at the start and at every reload (so that a
// reload compares the file with what runs as the command line said, and warns of no change that
// is not one), and checks what the file's rules check of them: distinct ports, and an upstream
// when the proxy listener runs.
func (o overrides) apply(cfg *config.Config) error {
	if o.listen != nil {
		cfg.Listen = o.listen.addr
	}
	if o.admin != nil {
		cfg.AdminListen = o.admin.addr
	}
	if cfg.AdminListen != "" && cfg.AdminListen == cfg.Listen {
		return fmt.Errorf("%s: %s %q is also %s; give them different ports", cfg.File, o.name(o.admin, "admin_listen"), cfg.AdminListen, o.name(o.listen, "listen"))
	}
	if cfg.RLS != nil && cfg.RLS.Listen != "" && (cfg.RLS.Listen == cfg.Listen || cfg.RLS.Listen == cfg.AdminListen) {
		what := o.name(o.listen, "listen")
		if cfg.RLS.Listen == cfg.AdminListen {
			what = o.name(o.admin, "admin_listen")
		}
		return fmt.Errorf("%s: rls.listen %q is also %s; give it a port of its own", cfg.File, cfg.RLS.Listen, what)
	}
	if cfg.Listen != "" && cfg.Upstream == nil {
		return fmt.Errorf("%s: %s %q runs the proxy, and the file has no upstream (the URL of the API behind sluice)", cfg.File, o.name(o.listen, "listen"), cfg.Listen)
	}
	return nil
}

// name is where an address came from: the override's flag or variable, else the file's field.
func (overrides) name(o *override, field string) string {
	if o != nil {
		return o.from
	}
	return field
}
