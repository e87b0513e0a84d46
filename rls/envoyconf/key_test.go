package envoyconf

import (
	"strings"
	"testing"
)

// TestCounterKeysStay pins Match.Key byte for byte: the keys are where a store keeps its counters,
// so a deployed service whose keys changed with a new version would start every counter again.
// The cases cover a plain rule, a nested path with share_threshold's wildcard value in place of
// the request's, an override (the request's own values), and entries long enough to leave any
// buffer a key is built in, with bytes the readable part spells as '_'. The expected keys were
// computed by the code of the previous version (a sha256.New hash written in pieces).
func TestCounterKeysStay(t *testing.T) {
	c := load(t, "share_threshold.yaml")
	long := strings.Repeat("v{é} ", 200)
	cases := []struct {
		name     string
		entries  []Entry
		override *Override
		key      string
	}{
		{"exact value", kv("file", "test1"), nil, "test-domain:file=test1:bfbbca26b78277891ea10c1a9ebb6292"},
		{"shared wildcard", kv("files", "files/a.pdf"), nil, "test-domain:files=files/*:aa681464953f6c13d21c16e175b725a5"},
		{"nested shared wildcards", kv("user", "user/alice", "resource", "res/file1", "action", "read"), nil, "test-domain:user=user/*/resource=res/*/action:0a4cc6b77a264d1b1b900401fd508e7f"},
		{"wildcard not shared", kv("path", "path/foo", "file", "file/doc1", "type", "pdf"), nil, "test-domain:path=path/*/file=file/*/type:73501ab9609351d779e139b377d4f052"},
		{"override of a rule", kv("file", "test1"), &Override{RequestsPerUnit: 7, Unit: Hour, UnitMultiplier: 3}, "test-domain:file=test1:b365fa7f954563a717dc7ca4540b47a0"},
		{"override, no rule", kv("nothing", long), &Override{RequestsPerUnit: 1, Unit: Second}, "test-domain:(override):91d869bd9c49f83827e32b43ace272ed"},
		{"long value", kv("path", "path/foo", "file", "file/"+long, "type", "pdf"), nil, "test-domain:path=path/*/file=file/*/type:5cbfdc9a517dfe7fc7b2f26f51b3417e"},
	}
	for _, tc := range cases {
		m, ok := c.Match("test-domain", tc.entries, tc.override)
		if !ok {
			t.Fatalf("%s: no match", tc.name)
		}
		if m.Key != tc.key {
			t.Errorf("%s: key %q, want %q", tc.name, m.Key, tc.key)
		}
	}
}
