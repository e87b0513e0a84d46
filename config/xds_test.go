package config

import (
	"reflect"
	"testing"
	"time"
)

// rls.xds's errors, each at its line. They join errorCases, so that TestErrors checks them and
// FuzzParse starts from them.
var xdsErrorCases = []struct {
	name string
	yaml string
	want []wantErr
}{
	{"xds: both sources", up + "rls:\n  envoy_config: [a.yaml]\n  xds: {server: cp:18001, node_id: n}\n",
		[]wantErr{at(3, "rls: envoy_config and xds are both set")}},
	{"xds: neither source", up + "rls:\n  listen: 127.0.0.1:8081\n", []wantErr{at(3, "envoy_config, xds or quota is required")}},
	{"xds: no server", up + "rls:\n  xds: {node_id: n}\n", []wantErr{at(3, "rls.xds: server is required")}},
	{"xds: server without port", up + "rls:\n  xds: {server: cp, node_id: n}\n", []wantErr{at(3, `rls.xds: server "cp" is not host:port`)}},
	{"xds: server without host", up + "rls:\n  xds: {server: \":18001\", node_id: n}\n", []wantErr{at(3, `server ":18001" is not host:port with a host`)}},
	{"xds: no node_id", up + "rls:\n  xds:\n    server: cp:18001\n", []wantErr{at(4, "rls.xds: node_id is required")}},
	{"xds: empty node_id", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: \"\"\n", []wantErr{at(5, "node_id must not be empty")}},
	{"xds: unknown field", up + "rls:\n  xds: {server: cp:18001, node_id: n, nodeid: m}\n", []wantErr{at(3, `unknown field "nodeid"; did you mean "node_id"?`)}},
	{"xds: node_metadata a list", up + "rls:\n  xds: {server: cp:18001, node_id: n, node_metadata: [a]}\n", []wantErr{at(3, "node_metadata must be a mapping")}},
	{"xds: node_metadata value", up + "rls:\n  xds: {server: cp:18001, node_id: n, node_metadata: {a: [b]}}\n", []wantErr{at(3, "node_metadata.a must be a string")}},
	{"xds: cert without key", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    tls: {cert_file: $DIR/cert.pem}\n", []wantErr{at(6, "rls.xds.tls: key_file is required with cert_file")}},
	{"xds: missing ca", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    tls:\n      ca_file: /nonexistent/ca.pem\n", []wantErr{at(7, `rls.xds.tls: ca_file "/nonexistent/ca.pem" cannot be read`)}},
	{"xds: ca not PEM", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    tls:\n      ca_file: $DIR/garbage.pem\n", []wantErr{at(7, "holds no PEM certificate")}},
	{"xds: cert and key not a pair", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    tls:\n      cert_file: $DIR/cert.pem\n      key_file: $DIR/garbage.pem\n",
		[]wantErr{at(7, "cert_file and key_file are not a PEM certificate and its private key")}},
	{"xds: unknown tls field", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    tls: {ca: x}\n", []wantErr{at(6, `rls.xds.tls: unknown field "ca"`)}},
	{"xds: retry not a duration", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    connect_retry: {initial: 5}\n", []wantErr{at(6, "rls.xds.connect_retry: initial 5 has no unit")}},
	{"xds: retry zero", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    connect_retry: {max: 0s}\n", []wantErr{at(6, "max 0s must be greater than 0")}},
	{"xds: retry max below initial", up + "rls:\n  xds:\n    server: cp:18001\n    node_id: n\n    connect_retry: {initial: 10s, max: 1s}\n", []wantErr{at(6, "max 1s is less than initial 10s")}},
}

func init() {
	errorCases = append(errorCases, xdsErrorCases...)
}

// Every field of rls.xds is read; the files are resolved and checked; defaults fill the rest.
func TestRLSXDS(t *testing.T) {
	cfg, err := parseTest(t, up+`rls:
  listen: 127.0.0.1:8081
  xds:
    server: envoy-gateway:18001
    node_id: envoy-ratelimit
    node_metadata: {zone: a, tier: "1"}
    tls:
      ca_file: $DIR/xds-ca.pem
      cert_file: $DIR/cert.pem
      key_file: $DIR/key.pem
      server_name: envoy-gateway
    connect_retry: {initial: 200ms, max: 5s}
`)
	if err != nil {
		t.Fatal(err)
	}
	dir := fixtures(t)
	x := cfg.RLS.XDS
	want := &XDS{Server: "envoy-gateway:18001", NodeID: "envoy-ratelimit", NodeMetadata: map[string]string{"zone": "a", "tier": "1"},
		TLS:          &XDSTLS{CA: dir + "/xds-ca.pem", Cert: dir + "/cert.pem", Key: dir + "/key.pem", ServerName: "envoy-gateway"},
		RetryInitial: 200 * time.Millisecond, RetryMax: 5 * time.Second, Line: x.Line}
	if !reflect.DeepEqual(x, want) || len(cfg.RLS.EnvoyConfig) != 0 {
		t.Errorf("rls.xds %+v %+v, want %+v %+v", x, x.TLS, want, want.TLS)
	}

	cfg, err = parseTest(t, up+"rls:\n  xds: {server: cp:18001, node_id: n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if x := cfg.RLS.XDS; x.TLS != nil || x.RetryInitial != DefaultXDSRetryInitial || x.RetryMax != DefaultXDSRetryMax || x.NodeMetadata != nil {
		t.Errorf("defaults: %+v", x)
	}
}
