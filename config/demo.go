package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// DemoAPIKey is the API key of the demo configuration's one client, "demo-partner". It is
// public: the demo prints it so that people can try the gateway with curl.
const DemoAPIKey = "sluice-demo-key"

// DemoYAML is the demo configuration as a file, with upstream in place (see Demo).
func DemoYAML(upstream string) []byte {
	sum := sha256.Sum256([]byte(DemoAPIKey))
	return fmt.Appendf(nil, `# sluice's built-in demo: what "sluice serve" runs without --config.
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
upstream: %q
store:
  type: memory
identity:
  - api_key: {header: X-API-Key}     # the demo client: -H 'X-API-Key: %s'
  - ip: {}                           # everyone else, by address
policies:
  - {name: anonymous, algorithm: token-bucket, limit: 10, period: 10s, burst: 20}
  - {name: partner, algorithm: sliding-window, limit: 50, period: 10s}
  - {name: queue, algorithm: leaky-bucket, limit: 2, period: 1s, burst: 5}
default_policy: anonymous
clients:
  - {name: demo-partner, api_key_sha256: %s, policy: partner}
routes:
  - {method: POST, path_prefix: /reports, cost: 5}   # a report costs 5 requests
  - {path_prefix: /queue, policy: queue}             # held (delayed), not refused, while the queue has room
`, upstream, DemoAPIKey, hex.EncodeToString(sum[:]))
}

// Demo returns the built-in demo configuration that `sluice serve` runs without --config, in
// front of upstream (the URL of a demo backend the caller started, e.g. on a free port):
//
//   - the memory store, listening on DefaultListen with the admin listener on DefaultAdminListen;
//   - anonymous clients, one per IP address: "anonymous", a token bucket of 10 per 10 seconds
//     that saves up to 20: 25 requests at once get 20 answers and 5 refusals unless they take
//     5 s to arrive, on any machine, and a bucket emptied by hand is full again 20 s later;
//   - one client, "demo-partner", whose API key is DemoAPIKey (header X-API-Key): "partner",
//     a sliding window of 50 per 10 seconds;
//   - POST /reports costs 5; /queue is "queue", a leaky bucket of 2 a second with room for 5,
//     which holds requests instead of refusing them: of 6 sent at once, 5 wait (0.5 s to
//     2.5 s) unless they arrive half a second apart.
//
// The error is Parse's, for an upstream that is not an http or https URL.
func Demo(upstream string) (*Config, error) {
	cfg, err := parse(DemoYAML(upstream), "demo", func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, err
	}
	return cfg, nil
}
