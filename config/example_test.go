package config_test

import (
	"fmt"

	"github.com/sluicehq/sluice/config"
)

func ExampleParse() {
	_, err := config.Parse([]byte(`upstream: http://127.0.0.1:9000
store:
  type: redis
  adrs: [127.0.0.1:6379]
policies:
  - {name: gold, algorithm: token-bucket, limit: 100, period: 1m, burst: -5}
  - {name: silver, algorithm: fixed-window, limit: abc, period: 1m}
default_policy: platinum
`), "sluice.yaml")
	fmt.Println(err)
	// Output:
	// sluice.yaml:3:3: store: the redis store needs addrs (e.g. addrs: [127.0.0.1:6379]), url or sentinel
	// sluice.yaml:4:3: store: unknown field "adrs"; did you mean "addrs"?
	// sluice.yaml:6:74: policies[0] "gold": burst -5 must be ≥ 0
	// sluice.yaml:7:52: policies[1] "silver": limit "abc" must be an integer
	// sluice.yaml:8:17: default_policy "platinum" is not defined in policies (known: gold, silver)
}

func ExampleDemo() {
	cfg, err := config.Demo("http://127.0.0.1:9000")
	if err != nil {
		panic(err)
	}
	partner, _ := cfg.ClientByAPIKey(config.DemoAPIKey)
	fmt.Println(cfg)
	fmt.Println(partner.Name, cfg.PoliciesFor(partner, nil)[0].Name)
	// Output:
	// config "demo": listen 127.0.0.1:8080, admin 127.0.0.1:9090, upstream http://127.0.0.1:9000, store memory, identity [api_key ip], 3 policies, 1 clients, 2 routes
	// demo-partner partner
}
