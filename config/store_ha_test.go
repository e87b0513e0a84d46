package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestStoreSentinelAndReplicasAck: store.sentinel (the sentinels' own password from the
// environment, the primary's the store's) and replicas_ack with its timeout are read.
func TestStoreSentinelAndReplicasAck(t *testing.T) {
	cfg, err := parseTest(t, up+`store:
  type: redis
  password_env: REDIS_PASSWORD
  sentinel:
    master: sluice-primary
    addrs: [10.0.0.1:26379, 10.0.0.2:26379, 10.0.0.3:26379]
    username: watcher
    password_env: SENTINEL_PASSWORD
  replicas_ack: 1
  replicas_ack_timeout: 20ms
`)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Store
	sn := s.Sentinel
	if sn == nil || sn.Master != "sluice-primary" || len(sn.Addrs) != 3 || sn.Addrs[2] != "10.0.0.3:26379" || sn.Username != "watcher" ||
		sn.Password.Value() != testEnv["SENTINEL_PASSWORD"] || sn.PasswordEnv != "SENTINEL_PASSWORD" {
		t.Fatalf("sentinel = %+v", sn)
	}
	if s.Password.Value() != testEnv["REDIS_PASSWORD"] || s.ReplicasAck != 1 || s.ReplicasAckTimeout != 20*time.Millisecond || len(s.Addrs) != 0 || s.URL != "" {
		t.Fatalf("store = %+v", s)
	}
	if cfg, err := parseTest(t, up+"store: {type: redis, addrs: [r:6379]}\n"); err != nil || cfg.Store.ReplicasAck != 0 || cfg.Store.ReplicasAckTimeout != 0 || cfg.Store.Sentinel != nil {
		t.Fatalf("defaults: %+v, %v; want replicas_ack off, no sentinel", cfg.Store, err)
	}
}

// TestStoreSentinelErrors: every bad sentinel or replicas_ack is an error naming the field, at
// its line.
func TestStoreSentinelErrors(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []wantErr
	}{
		{"sentinel and addrs", up + "store:\n  type: redis\n  addrs: [r:6379]\n  sentinel: {master: m, addrs: [s:26379]}\n",
			[]wantErr{at(5, "store: sentinel and addrs are both set")}},
		{"sentinel and url", up + "store:\n  type: redis\n  url: redis://r:6379\n  sentinel: {master: m, addrs: [s:26379]}\n",
			[]wantErr{at(5, "store: sentinel and url are both set")}},
		{"sentinel without master", up + "store:\n  type: redis\n  sentinel:\n    addrs: [s:26379]\n",
			[]wantErr{at(5, "store.sentinel: sentinel needs master")}},
		{"sentinel empty master", up + "store:\n  type: redis\n  sentinel: {master: '', addrs: [s:26379]}\n",
			[]wantErr{at(4, "store.sentinel: master is empty")}},
		{"sentinel without addrs", up + "store:\n  type: redis\n  sentinel: {master: m}\n",
			[]wantErr{at(4, "store.sentinel: sentinel needs addrs")}},
		{"sentinel bad addr", up + "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: [s:26379, sentinel.local]\n",
			[]wantErr{at(6, `store.sentinel: addrs[1] "sentinel.local" is not host:port (e.g. 127.0.0.1:26379)`)}},
		{"sentinel unknown field", up + "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: [s:26379]\n    mastr: x\n",
			[]wantErr{at(7, `store.sentinel: unknown field "mastr"`, `did you mean "master"`)}},
		{"sentinel not a mapping", up + "store: {type: redis, sentinel: [s:26379]}\n",
			[]wantErr{at(2, "sentinel must be a mapping")}},
		{"sentinel password twice", up + "store:\n  type: redis\n  sentinel: {master: m, addrs: [s:26379], password: x, password_env: SENTINEL_PASSWORD}\n",
			[]wantErr{at(4, "store.sentinel: password_env and password are both set")}},
		{"sentinel password_env unset", up + "store:\n  type: redis\n  sentinel:\n    master: m\n    addrs: [s:26379]\n    password_env: NO_SUCH_VAR\n",
			[]wantErr{at(7, "store.sentinel: missing sentinel password: the environment variable NO_SUCH_VAR named by password_env is unset or empty")}},
		{"sentinel on memory", up + "store:\n  sentinel: {master: m, addrs: [s:26379]}\n",
			[]wantErr{at(3, "sentinel has no meaning for the memory store")}},
		{"replicas_ack negative", up + "store:\n  type: redis\n  addrs: [r:6379]\n  replicas_ack: -1\n",
			[]wantErr{at(5, "store: replicas_ack -1 must be from 0 (off) to 1000")}},
		{"replicas_ack type", up + "store:\n  type: redis\n  addrs: [r:6379]\n  replicas_ack: all\n",
			[]wantErr{at(5, "replicas_ack", "must be an integer")}},
		{"replicas_ack_timeout zero", up + "store:\n  type: redis\n  addrs: [r:6379]\n  replicas_ack: 1\n  replicas_ack_timeout: 0s\n",
			[]wantErr{at(6, "store: replicas_ack_timeout 0s must be > 0")}},
		{"replicas_ack_timeout sub-millisecond", up + "store:\n  type: redis\n  addrs: [r:6379]\n  replicas_ack_timeout: 1500us\n",
			[]wantErr{at(5, "replicas_ack_timeout 1.5ms must be a whole number of milliseconds")}},
		{"replicas_ack on memory", up + "store:\n  replicas_ack: 1\n",
			[]wantErr{at(3, "replicas_ack has no meaning for the memory store")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseTest(t, c.yaml)
			var errs Errors
			if !errors.As(err, &errs) || cfg != nil {
				t.Fatalf("parse = %v, %v; want Errors", cfg, err)
			}
			if len(errs) != len(c.want) {
				t.Fatalf("%d errors, want %d:\n%v", len(errs), len(c.want), err)
			}
			for i, w := range c.want {
				if errs[i].Line != w.line {
					t.Errorf("error %d at line %d, want %d: %v", i, errs[i].Line, w.line, errs[i])
				}
				for _, word := range w.words {
					if !strings.Contains(errs[i].Error(), word) {
						t.Errorf("error %d %q lacks %q", i, errs[i], word)
					}
				}
			}
		})
	}
}
