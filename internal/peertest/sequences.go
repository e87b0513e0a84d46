package peertest

import (
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
)

// The request sequences and the peer's answers to them. The peer's own integration tests
// (test/integration/integration_test.go at Version) give the first ones, on their files
// (testdata/basic.yaml, another.yaml, share_threshold.yaml, reload.yaml); the examples of the
// peer's README the next (testdata/readme_example*.yaml); sluice's own files (units, nested,
// wildcard, modes, addend, cost .yaml) pin down what those leave open. Every answer here is the peer's,
// as TestPeerPassesItsOwnSequences proves on every run.
//
// What the peer answers, in short (see each sequence's About):
//   - a descriptor no rule matches (or an unknown domain): OK, no current_limit, limit_remaining 0,
//     no duration_until_reset; an unlimited rule: the same but limit_remaining 4294967295;
//   - under the limit: OK, the rule as current_limit (with its rate_limit.name), the rest of the
//     window's allowance, the time to the window's end; over: OVER_LIMIT, remaining 0, the same
//     limit and time;
//   - the counter is the request's domain and entries (key and value, even for a rule without
//     a value or with a wildcard one; the wildcard itself with share_threshold) and the window:
//     not the rule, so an override of the limit counts on the same counter as the rule;
//   - every hit is counted, refused or not: a hits_addend that crosses the limit is refused and
//     still added, and so are the hits of a request that another descriptor refuses;
//   - the overall code is OVER_LIMIT when any descriptor is (shadow_mode and quota_mode
//     descriptors answer OK instead, and do not count towards it).

// Sequences returns every sequence, in a fixed order.
func Sequences() []Sequence {
	var all []Sequence
	all = append(all, integrationSequences()...)
	all = append(all, unitSequences()...)
	all = append(all, readmeSequences()...)
	all = append(all, treeSequences()...)
	all = append(all, wildcardSequences()...)
	all = append(all, modeSequences()...)
	all = append(all, addendSequences()...)
	all = append(all, costSequences()...)
	all = append(all, overrideSequences()...)
	all = append(all, errorSequences()...)
	return all
}

// Helpers that keep the data readable.

func lim(n uint32, u Unit) *Limit { return &Limit{RequestsPerUnit: n, Unit: u} }

func named(n uint32, u Unit, name string) *Limit {
	return &Limit{RequestsPerUnit: n, Unit: u, Name: name}
}

// ok is an allowed descriptor's status; over a refused one's.
func ok(l *Limit, remaining uint32) Status { return Status{Code: OK, Limit: l, Remaining: remaining} }
func over(l *Limit) Status                 { return Status{Code: OverLimit, Limit: l} }

// shadowed is a shadow_mode descriptor over its limit: OK, with the limit and the time to reset.
func shadowed(l *Limit) Status { return Status{Code: OK, Limit: l} }

// quotaOver is a quota_mode descriptor over its limit: OK, the limit, and no time to reset.
func quotaOver(l *Limit) Status { return Status{Code: OK, Limit: l, NoReset: true} }

var (
	noLimit   = Status{Code: OK}
	unlimited = Status{Code: OK, Remaining: math.MaxUint32}
)

// answer is the response of statuses: OVER_LIMIT overall if one of them is.
func answer(statuses ...Status) Want {
	w := Want{Overall: OK, Statuses: statuses}
	for _, s := range statuses {
		if s.Code == OverLimit {
			w.Overall = OverLimit
		}
	}
	return w
}

func req(domain string, ds ...Descriptor) Request { return Request{Domain: domain, Descriptors: ds} }

// one is a request of one descriptor of one entry.
func one(domain, key, value string) Request { return req(domain, D(E(key, value))) }

func step(note string, r Request, w Want) Step { return Step{Note: note, Req: r, Want: w} }

// repeat is n steps sending r, the i-th (1-based) answered by want(i).
func repeat(note string, n int, r Request, want func(i int) Want) []Step {
	steps := make([]Step, n)
	for i := range steps {
		steps[i] = Step{Note: fmt.Sprintf("%s, hit %d", note, i+1), Req: r, Want: want(i + 1)}
	}
	return steps
}

// countdown is n hits of r on a fresh counter of one descriptor with limit l: l's allowance
// counting down to 0, then refusals.
func countdown(note string, n int, r Request, l *Limit) []Step {
	return repeat(note, n, r, func(i int) Want {
		if uint32(i) > l.RequestsPerUnit {
			return answer(over(l))
		}
		return answer(ok(l, l.RequestsPerUnit-uint32(i)))
	})
}

func withLimit(d Descriptor, l *Limit) Descriptor { d.Limit = l; return d }

func withAddend(d Descriptor, n uint64) Descriptor { d.HitsAddend = &n; return d }

func addend(r Request, n uint32) Request { r.HitsAddend = n; return r }

func cat(parts ...[]Step) []Step {
	var all []Step
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func integrationSequences() []Sequence {
	key2, key3 := lim(20, Minute), lim(10, Hour)
	twoKeys := req("another", D(E("key2", "7")), D(E("key3", "7")))
	share := lim(10, Hour)
	var noShare []Step
	for i := range 10 {
		noShare = append(noShare, step(fmt.Sprintf("files_no_share value %d", i+1),
			one("share-threshold-test", "files_no_share", fmt.Sprintf("files_no_share/%d", i)), answer(ok(share, 9))))
	}
	return []Sequence{{
		Name:    "integration/unknown-domain-then-a-rule",
		About:   "the peer's basic test: an unknown domain answers OK with no limit; a 50/s rule answers 49 remaining",
		Configs: []string{"basic.yaml"},
		Steps: []Step{
			step("unknown domain", one("foo", "hello", "world"), answer(noLimit)),
			step("first hit of 50/s", one("basic", "key1", "foo"), answer(ok(lim(50, Second), 49))),
		},
	}, {
		Name:    "integration/minute-limit",
		About:   "the peer's basic test: 25 hits on a 20/minute rule of a value-less key: 19..0 remaining, then OVER_LIMIT",
		Configs: []string{"another.yaml"},
		Steps:   countdown("20/minute", 25, one("another", "key2", "42"), key2),
	}, {
		Name: "integration/two-descriptors-one-over",
		About: "the peer's basic test: two descriptors in one request, 20/minute and 10/hour: from the 11th hit the second " +
			"is OVER_LIMIT and so is the overall code, while the first stays OK and keeps being counted (its remaining still falls)",
		Configs: []string{"another.yaml"},
		Steps: repeat("20/minute and 10/hour", 15, twoKeys, func(i int) Want {
			second := over(key3)
			if i <= 10 {
				second = ok(key3, uint32(10-i))
			}
			return answer(ok(key2, uint32(20-i)), second)
		}),
	}, {
		Name:    "integration/day-limit-reset",
		About:   "the peer's basic test's duration_until_reset check: a day rule's time to reset is the time to the end of the UTC day",
		Configs: []string{"another.yaml"},
		Steps:   countdown("20/day", 2, one("another", "key4", "durTest"), lim(20, Day)),
	}, {
		Name: "integration/share-threshold",
		About: "the peer's share_threshold test: with share_threshold every value under files/* counts on one counter " +
			"(10 hits of files/a.pdf use up files/b.csv's allowance); without it each value has its own",
		Configs: []string{"share_threshold.yaml"},
		Steps: cat(
			countdown("files/a.pdf", 10, one("share-threshold-test", "files", "files/a.pdf"), share),
			[]Step{step("files/b.csv shares the counter", one("share-threshold-test", "files", "files/b.csv"), answer(over(share)))},
			noShare,
		),
	}, {
		Name:    "integration/reload-file",
		About:   "the rules of the file the peer's reload test loads: requests_per_unit 0 refuses every hit (with current_limit 0/SECOND); 1/minute allows one",
		Configs: []string{"reload.yaml"},
		Steps: cat(
			[]Step{
				step("requests_per_unit 0", one("reload", "block", "foo"), answer(over(lim(0, Second)))),
				step("50/s", one("reload", "key1", "foo"), answer(ok(lim(50, Second), 49))),
			},
			countdown("1/minute", 2, one("reload", "one_per_minute", "x"), lim(1, Minute)),
		),
	}}
}

func unitSequences() []Sequence {
	var seqs []Sequence
	for _, u := range []struct {
		key  string
		unit Unit
	}{{"second", Second}, {"minute", Minute}, {"hour", Hour}, {"day", Day}, {"week", Week}, {"month", Month}, {"year", Year}, {"upper", Minute}} {
		l := lim(2, u.unit)
		about := fmt.Sprintf("2 per %s: two hits allowed, the third refused; another value has its own counter; "+
			"duration_until_reset runs to the end of the %s window counted from the Unix epoch",
			u.key, u.key)
		if u.key == "upper" {
			about = "a rule written unit: MINUTE (upper case) is a minute rule"
		}
		seqs = append(seqs, Sequence{
			Name:    "units/" + u.key,
			About:   about,
			Configs: []string{"units.yaml"},
			Steps: cat(
				countdown("2 per "+u.key, 3, one("units", u.key, "a"), l),
				[]Step{step("another value", one("units", u.key, "b"), answer(ok(l, 1)))},
			),
		})
	}
	return seqs
}

func readmeSequences() []Sequence {
	marketing, perNumber := lim(5, Day), lim(100, Day)
	both := req("messaging", D(E("message_type", "marketing"), E("to_number", "2061111111")), D(E("to_number", "2061111111")))
	userA, userB := lim(10, Second), lim(20, Second)
	specific, replacing := named(5, Second, "specific_limit"), lim(10, Second)
	key1 := D(E("key_1", "value_1"), E("user", "bkthomps"))
	key2 := D(E("key_2", "value_2"), E("user", "bkthomps"))
	example9 := lim(20, Minute)
	return []Sequence{{
		Name: "readme/example2-nested-and-aggregate",
		About: "a nested rule (message_type=marketing, then any to_number: 5/day) and a top-level one (to_number: 100/day) " +
			"in one request: each descriptor its own counter and answer, OVER_LIMIT overall once the first is over; " +
			"a placeholder level without a limit limits nothing",
		Configs: []string{"readme_example2.yaml"},
		Steps: cat(
			repeat("marketing message and per-number", 6, both, func(i int) Want {
				first := over(marketing)
				if i <= 5 {
					first = ok(marketing, uint32(5-i))
				}
				return answer(first, ok(perNumber, uint32(100-i)))
			}),
			[]Step{
				step("another number has its own counter",
					req("messaging", D(E("message_type", "marketing"), E("to_number", "2062222222"))), answer(ok(marketing, 4))),
				step("the placeholder level alone", one("messaging", "message_type", "marketing"), answer(noLimit)),
				step("another message type", req("messaging", D(E("message_type", "transactional"), E("to_number", "2061111111"))), answer(noLimit)),
				step("the top-level rule alone shares the counter", one("messaging", "to_number", "2061111111"), answer(ok(perNumber, 93))),
			},
		),
	}, {
		Name:    "readme/example3-value-before-key",
		About:   "key and value match before key alone: 50.0.0.5 has 0/s (refused at once), every other address 10/s on its own counter",
		Configs: []string{"readme_example3.yaml"},
		Steps: cat(
			countdown("an address", 3, one("edge_proxy_per_ip", "remote_address", "50.0.0.1"), lim(10, Second)),
			[]Step{
				step("the blocked address", one("edge_proxy_per_ip", "remote_address", "50.0.0.5"), answer(over(lim(0, Second)))),
				step("another address", one("edge_proxy_per_ip", "remote_address", "50.0.0.2"), answer(ok(lim(10, Second), 9))),
			},
		),
	}, {
		Name:    "readme/example4-depth",
		About:   "a rule applies only to a request as deep as it: one entry matches the one-level rule, two entries the two-level one, and not the other way round",
		Configs: []string{"readme_example4.yaml", "readme_example4_nested.yaml"},
		Steps: []Step{
			step("two entries, one-level rule", req("example4", D(E("key", "value"), E("subkey", "subvalue"))), answer(noLimit)),
			step("one entry, one-level rule", one("example4", "key", "value"), answer(ok(lim(300, Second), 299))),
			step("two entries, two-level rule", req("example4_nested", D(E("key", "value"), E("subkey", "subvalue"))), answer(ok(lim(300, Second), 299))),
			step("one entry, two-level rule", one("example4_nested", "key", "value"), answer(noLimit)),
		},
	}, {
		Name:    "readme/example5-unlimited",
		About:   "an unlimited rule answers OK with limit_remaining 4294967295 and no current_limit, beside a counted rule",
		Configs: []string{"readme_example5.yaml"},
		Steps: []Step{
			step("unlimited", one("internal", "ldap", "x"), answer(unlimited)),
			step("unlimited again", one("internal", "ldap", "x"), answer(unlimited)),
			step("100/minute", one("internal", "azure", "x"), answer(ok(lim(100, Minute), 99))),
			step("both", req("internal", D(E("ldap", "x")), D(E("azure", "x"))), answer(unlimited, ok(lim(100, Minute), 98))),
		},
	}, {
		Name: "readme/example6-shadow-mode",
		About: "a shadow_mode rule over its limit answers OK (overall OK too), with its current_limit, limit_remaining 0 " +
			"and the time to reset; its neighbour without shadow_mode counts as usual",
		Configs: []string{"readme_example6.yaml"},
		Steps: cat(
			repeat("user-a, shadow_mode 10/s", 12, req("example6", D(E("service", "auth-service"), E("user", "user-a"))), func(i int) Want {
				if i > 10 {
					return answer(shadowed(userA))
				}
				return answer(ok(userA, uint32(10-i)))
			}),
			[]Step{step("user-b, 20/s", req("example6", D(E("service", "auth-service"), E("user", "user-b"))), answer(ok(userB, 19)))},
		),
	}, {
		Name: "readme/example7-replaces",
		About: "a rule that replaces a named one, in the same request, leaves it out: its status is OK with no limit, and " +
			"it is not counted (the named rule alone afterwards has the allowance it had); the named rule's current_limit carries its name",
		Configs: []string{"readme_example7.yaml"},
		Steps: []Step{
			step("the named rule alone", req("example7", key1), answer(ok(specific, 4))),
			step("both: the named rule is replaced", req("example7", key1, key2), answer(noLimit, ok(replacing, 9))),
			step("the named rule alone again", req("example7", key1), answer(ok(specific, 3))),
		},
	}, {
		Name:    "readme/example9-wildcard",
		About:   "a trailing-* value matches every value with its prefix (the prefix itself too), each on its own counter; others match nothing",
		Configs: []string{"readme_example9.yaml"},
		Steps: cat(
			countdown("value1", 2, one("example9", "key1", "value1"), example9),
			[]Step{
				step("value2 has its own counter", one("example9", "key1", "value2"), answer(ok(example9, 19))),
				step("the prefix itself", one("example9", "key1", "value"), answer(ok(example9, 19))),
				step("another value", one("example9", "key1", "other"), answer(noLimit)),
			},
		),
	}}
}

func treeSequences() []Sequence {
	tenant, path, admin, shared := lim(10, Minute), lim(3, Minute), lim(1, Hour), lim(4, Minute)
	acme := func(p string) Request { return req("nested", D(E("tenant", "acme"), E("path", p))) }
	return []Sequence{{
		Name: "nested/tree",
		About: "walking a descriptor tree: key and value before key alone at each level; a value-less key's counter is per " +
			"value (of every entry of the request); a limit applies only at the request's own depth (deeper requests, entries " +
			"out of order, and placeholder levels match nothing); a descriptor with no entries matches nothing",
		Configs: []string{"nested.yaml"},
		Steps: []Step{
			step("level one", one("nested", "tenant", "acme"), answer(ok(tenant, 9))),
			step("level two, value-less path", acme("/a"), answer(ok(path, 2))),
			step("level two again", acme("/a"), answer(ok(path, 1))),
			step("another path value has its own counter", acme("/b"), answer(ok(path, 2))),
			step("path=/admin before path alone", acme("/admin"), answer(ok(admin, 0))),
			step("path=/admin over", acme("/admin"), answer(over(admin))),
			step("any tenant, path=/shared", req("nested", D(E("tenant", "globex"), E("path", "/shared"))), answer(ok(shared, 3))),
			step("another tenant has its own counter", req("nested", D(E("tenant", "initech"), E("path", "/shared"))), answer(ok(shared, 3))),
			step("the placeholder level alone", one("nested", "tenant", "globex"), answer(noLimit)),
			step("a path the placeholder has no rule for", req("nested", D(E("tenant", "globex"), E("path", "/other"))), answer(noLimit)),
			step("deeper than the tree", req("nested", D(E("tenant", "acme"), E("path", "/a"), E("extra", "1"))), answer(noLimit)),
			step("deeper than a leaf", req("nested", D(E("leaf", "only"), E("sub", "x"))), answer(noLimit)),
			step("entries out of order", req("nested", D(E("path", "/a"), E("tenant", "acme"))), answer(noLimit)),
			step("the leaf", one("nested", "leaf", "only"), answer(ok(lim(300, Minute), 299))),
			step("a descriptor with neither limit nor children", one("nested", "allowed", "x"), answer(noLimit)),
			step("a descriptor with no entries", req("nested", D()), answer(noLimit)),
			step("level one was not counted by level two's hits", one("nested", "tenant", "acme"), answer(ok(tenant, 8))),
		},
	}}
}

func wildcardSequences() []Sequence {
	v1, api, anyPath := lim(2, Minute), lim(5, Minute), lim(7, Minute)
	files := lim(3, Hour)
	op := lim(2, Minute)
	bucket := func(b, o string) Request { return req("wildcard", D(E("bucket", b), E("op", o))) }
	return []Sequence{{
		Name: "wildcard/precedence",
		About: "the exact value first, then the level's wildcards in the order written (the first matching prefix wins, " +
			"not the longest), then the key alone; each value that a wildcard matches has its own counter",
		Configs: []string{"wildcard.yaml"},
		Steps: cat(
			countdown("/api/v1/x", 3, one("wildcard", "path", "/api/v1/x"), v1),
			[]Step{
				step("/api/v1/y has its own counter", one("wildcard", "path", "/api/v1/y"), answer(ok(v1, 1))),
				step("the exact /api/v1/health (unlimited) before the wildcard", one("wildcard", "path", "/api/v1/health"), answer(unlimited)),
				step("/api/v2/x: the broader wildcard", one("wildcard", "path", "/api/v2/x"), answer(ok(api, 4))),
				step("the prefix itself matches", one("wildcard", "path", "/api/v1/"), answer(ok(v1, 1))),
				step("the key alone", one("wildcard", "path", "/other"), answer(ok(anyPath, 6))),
				step("abc: a* written first wins over ab*", one("wildcard", "route", "abc"), answer(ok(lim(4, Minute), 3))),
				step("ab: a* too", one("wildcard", "route", "ab"), answer(ok(lim(4, Minute), 3))),
				step("b: no wildcard and no key alone", one("wildcard", "route", "b"), answer(noLimit)),
			},
		),
	}, {
		Name:    "wildcard/share-threshold",
		About:   "with share_threshold, every value under the wildcard counts on one counter",
		Configs: []string{"wildcard.yaml"},
		Steps: []Step{
			step("files/a", one("wildcard", "files", "files/a"), answer(ok(files, 2))),
			step("files/a again", one("wildcard", "files", "files/a"), answer(ok(files, 1))),
			step("files/b: the same counter", one("wildcard", "files", "files/b"), answer(ok(files, 0))),
			step("files/c: over", one("wildcard", "files", "files/c"), answer(over(files))),
			step("not under files/", one("wildcard", "files", "other/a"), answer(noLimit)),
		},
	}, {
		Name:    "wildcard/with-children",
		About:   "a wildcard level with a child rule: the child's counter is per value of both entries",
		Configs: []string{"wildcard.yaml"},
		Steps: cat(
			countdown("logs-a get", 3, bucket("logs-a", "get"), op),
			[]Step{
				step("another bucket under the wildcard", bucket("logs-b", "get"), answer(ok(op, 1))),
				step("another op", bucket("logs-a", "put"), answer(ok(op, 1))),
				step("the wildcard level alone", one("wildcard", "bucket", "logs-a"), answer(noLimit)),
				step("a bucket the wildcard does not match", bucket("other", "get"), answer(noLimit)),
			},
		),
	}}
}

func modeSequences() []Sequence {
	shadow, strict, quota := lim(2, Minute), lim(1, Minute), lim(1, Minute)
	general, special := named(3, Minute, "general"), named(5, Minute, "special")
	g := func(v string) Descriptor { return D(E("general", v)) }
	s := func(v string) Descriptor { return D(E("special", v)) }
	return []Sequence{{
		Name:    "modes/unlimited",
		About:   "an unlimited rule: OK, limit_remaining 4294967295, no current_limit, no duration_until_reset, however often",
		Configs: []string{"modes.yaml"},
		Steps:   repeat("unlimited", 3, one("modes", "unlimited", "a"), func(int) Want { return answer(unlimited) }),
	}, {
		Name: "modes/shadow-mode",
		About: "a shadow_mode rule over its limit answers OK with its limit, limit_remaining 0 and the time to reset, " +
			"and does not make the overall code OVER_LIMIT; another descriptor over its own limit still does",
		Configs: []string{"modes.yaml"},
		Steps: cat(
			repeat("shadow 2/minute", 4, one("modes", "shadow", "a"), func(i int) Want {
				if i > 2 {
					return answer(shadowed(shadow))
				}
				return answer(ok(shadow, uint32(2-i)))
			}),
			[]Step{
				step("shadow over, strict allowed", req("modes", D(E("shadow", "a")), D(E("strict", "a"))), answer(shadowed(shadow), ok(strict, 0))),
				step("shadow over, strict over", req("modes", D(E("shadow", "a")), D(E("strict", "a"))), answer(shadowed(shadow), over(strict))),
			},
		),
	}, {
		Name:    "modes/zero",
		About:   "requests_per_unit 0 refuses every hit: OVER_LIMIT, current_limit 0/MINUTE",
		Configs: []string{"modes.yaml"},
		Steps:   repeat("0/minute", 2, one("modes", "zero", "a"), func(int) Want { return answer(over(lim(0, Minute))) }),
	}, {
		Name: "modes/quota-mode",
		About: "a quota_mode rule over its limit answers OK with its limit and limit_remaining 0 but no duration_until_reset, " +
			"and does not make the overall code OVER_LIMIT",
		Configs: []string{"modes.yaml"},
		Steps: []Step{
			step("quota 1/minute", one("modes", "quota", "a"), answer(ok(quota, 0))),
			step("quota over", one("modes", "quota", "a"), answer(quotaOver(quota))),
			step("quota and strict", req("modes", D(E("quota", "b")), D(E("strict", "b"))), answer(ok(quota, 0), ok(strict, 0))),
			step("both over", req("modes", D(E("quota", "b")), D(E("strict", "b"))), answer(quotaOver(quota), over(strict))),
		},
	}, {
		Name: "modes/replaces",
		About: "a matched rule whose replaces names another matched rule leaves that one out of the request, whatever the " +
			"order and values: OK with no limit and not counted, even when it is over its limit; an unlimited rule replaces too",
		Configs: []string{"modes.yaml"},
		Steps: []Step{
			step("general alone", req("modes", g("u")), answer(ok(general, 2))),
			step("general replaced by special", req("modes", g("u"), s("u")), answer(noLimit, ok(special, 4))),
			step("special first", req("modes", s("u"), g("u")), answer(ok(special, 3), noLimit)),
			step("general was not counted while replaced", req("modes", g("u")), answer(ok(general, 1))),
			step("general replaced by an unlimited rule", req("modes", g("u"), D(E("free", "u"))), answer(noLimit, unlimited)),
			step("general's last", req("modes", g("u")), answer(ok(general, 0))),
			step("general over", req("modes", g("u")), answer(over(general))),
			step("general over, but replaced", req("modes", g("u"), s("u")), answer(noLimit, ok(special, 2))),
			step("replaced whatever the values", req("modes", g("v"), s("w")), answer(noLimit, ok(special, 4))),
		},
	}}
}

func addendSequences() []Sequence {
	k, h := lim(5, Minute), lim(10, Hour)
	kd := func(v string) Descriptor { return D(E("k", v)) }
	hd := func(v string) Descriptor { return D(E("h", v)) }
	return []Sequence{{
		Name:    "addend/request",
		About:   "the request's hits_addend counts that many hits (0 counts as 1)",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("3 hits", addend(req("addend", kd("a")), 3), answer(ok(k, 2))),
			step("2 hits", addend(req("addend", kd("a")), 2), answer(ok(k, 0))),
			step("hits_addend 0 counts 1", req("addend", kd("a")), answer(over(k))),
		},
	}, {
		Name: "addend/over-the-limit-is-counted",
		About: "hits that cross the limit are refused and still counted: after 3+3 of 5 a check (descriptor hits_addend 0) is " +
			"OVER_LIMIT; 6 at once on a fresh counter are refused and counted; a check counts nothing, and a count equal to " +
			"the limit is still OK",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("3 of 5", addend(req("addend", kd("b")), 3), answer(ok(k, 2))),
			step("3 more cross the limit", addend(req("addend", kd("b")), 3), answer(over(k))),
			step("a check: the refused 3 were counted", req("addend", withAddend(kd("b"), 0)), answer(over(k))),
			step("6 at once on a fresh counter", addend(req("addend", kd("c")), 6), answer(over(k))),
			step("a check: they were counted", req("addend", withAddend(kd("c"), 0)), answer(over(k))),
			step("a check of a fresh counter counts nothing", req("addend", withAddend(kd("d"), 0)), answer(ok(k, 5))),
			step("5 of 5", addend(req("addend", kd("d")), 5), answer(ok(k, 0))),
			step("a check at the limit is OK", req("addend", withAddend(kd("d"), 0)), answer(ok(k, 0))),
		},
	}, {
		Name:    "addend/descriptor-level",
		About:   "a descriptor's own hits_addend counts for it instead of the request's; the others take the request's",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("request 4, k its own 1", addend(req("addend", withAddend(kd("e"), 1), hd("e")), 4), answer(ok(k, 4), ok(h, 6))),
			step("k a check, h its own 4", req("addend", withAddend(kd("e"), 0), withAddend(hd("e"), 4)), answer(ok(k, 4), ok(h, 2))),
			step("request 0 counts 1 each", req("addend", kd("e"), hd("e")), answer(ok(k, 3), ok(h, 1))),
			step("request 2: h over, k counted", addend(req("addend", kd("e"), hd("e")), 2), answer(ok(k, 1), over(h))),
			step("k's check: the refused request counted k", req("addend", withAddend(kd("e"), 0)), answer(ok(k, 1))),
		},
	}, {
		Name:    "addend/same-descriptor-twice",
		About:   "the same descriptor twice in one request counts twice, the first status before the second hit",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("twice", req("addend", kd("f"), kd("f")), answer(ok(k, 4), ok(k, 3))),
			step("three times", req("addend", kd("f"), kd("f"), kd("f")), answer(ok(k, 2), ok(k, 1), ok(k, 0))),
			step("over", req("addend", kd("f")), answer(over(k))),
		},
	}}
}

// costSequences are usage charged after the response, as Envoy Gateway's cost sends it: a check
// (the descriptor's own hits_addend 0) before the request, the charge (hits_addend N) at its end.
// The peer counts a charge even past the limit (answering it OVER_LIMIT), so the next check is
// refused; a check counts nothing, and is OK at the limit exactly.
func costSequences() []Sequence {
	tokens, requests, model, team := lim(10, Minute), lim(3, Minute), lim(100, Hour), lim(20, Hour)
	tok := func(user string, n uint64) Descriptor { return withAddend(D(E("tokens", user)), n) }
	const route = "httproute/default/llm/rule/0/match/0/llm"
	user := func(u string, n uint64) Descriptor { return withAddend(D(E(route, route), E("rule-0-match-0", u)), n) }
	return []Sequence{{
		Name: "cost/check-then-charge",
		About: "limit 10: check OK, charge 6, check OK, charge 6 (12 counted: OVER_LIMIT), then a check and a plain request " +
			"are OVER_LIMIT; at the limit exactly a check is OK with nothing left",
		Configs: []string{"cost.yaml"},
		Steps: []Step{
			step("check", req("cost", tok("a", 0)), answer(ok(tokens, 10))),
			step("charge 6", req("cost", tok("a", 6)), answer(ok(tokens, 4))),
			step("check", req("cost", tok("a", 0)), answer(ok(tokens, 4))),
			step("charge 6 passes the limit, counted", req("cost", tok("a", 6)), answer(over(tokens))),
			step("check after 12 of 10", req("cost", tok("a", 0)), answer(over(tokens))),
			step("a plain request", req("cost", D(E("tokens", "a"))), answer(over(tokens))),
			step("charge 10 of 10", req("cost", tok("b", 10)), answer(ok(tokens, 0))),
			step("a check at the limit", req("cost", tok("b", 0)), answer(ok(tokens, 0))),
			step("charge 1 more", req("cost", tok("b", 1)), answer(over(tokens))),
			step("a check past the limit", req("cost", tok("b", 0)), answer(over(tokens))),
			step("charge 12 at once on a fresh counter", req("cost", tok("c", 12)), answer(over(tokens))),
			step("a check: the 12 were counted", req("cost", tok("c", 0)), answer(over(tokens))),
		},
	}, {
		Name: "cost/several-descriptors",
		About: "a check and a charge of two descriptors at once (a route rule's per-user limit and a model's wildcard): " +
			"each counts its charge, and the one whose charge passes its limit refuses the next check",
		Configs: []string{"cost.yaml"},
		Steps: []Step{
			step("check both", req("cost", user("u1", 0), withAddend(D(E("model", "gpt-4")), 0)), answer(ok(tokens, 10), ok(model, 100))),
			step("charge 7 to both", req("cost", user("u1", 7), withAddend(D(E("model", "gpt-4")), 7)), answer(ok(tokens, 3), ok(model, 93))),
			step("check both", req("cost", user("u1", 0), withAddend(D(E("model", "gpt-4")), 0)), answer(ok(tokens, 3), ok(model, 93))),
			step("charge 7 to both: the user's passes its limit", req("cost", user("u1", 7), withAddend(D(E("model", "gpt-4")), 7)),
				answer(over(tokens), ok(model, 86))),
			step("check both", req("cost", user("u1", 0), withAddend(D(E("model", "gpt-4")), 0)), answer(over(tokens), ok(model, 86))),
			step("another user's check", req("cost", user("u2", 0), withAddend(D(E("model", "gpt-4")), 0)), answer(ok(tokens, 10), ok(model, 86))),
		},
	}, {
		Name: "cost/wildcards",
		About: "usage on wildcard rules: a value-less key and a wildcard count each value apart; a shared wildcard " +
			"(share_threshold) counts every value's charges on one counter",
		Configs: []string{"cost.yaml"},
		Steps: []Step{
			step("user x charged 11 of 10", req("cost", user("x", 11)), answer(over(tokens))),
			step("user x's check", req("cost", user("x", 0)), answer(over(tokens))),
			step("user y's check: a counter of its own", req("cost", user("y", 0)), answer(ok(tokens, 10))),
			step("gpt-4 charged 101 of 100", req("cost", withAddend(D(E("model", "gpt-4")), 101)), answer(over(model))),
			step("gpt-5's check: a counter of its own", req("cost", withAddend(D(E("model", "gpt-5")), 0)), answer(ok(model, 100))),
			step("eng-a charged 15 of 20", req("cost", withAddend(D(E("team", "eng-a")), 15)), answer(ok(team, 5))),
			step("eng-b charged 10: the shared counter passes 20", req("cost", withAddend(D(E("team", "eng-b")), 10)), answer(over(team))),
			step("eng-c's check", req("cost", withAddend(D(E("team", "eng-c")), 0)), answer(over(team))),
		},
	}, {
		Name: "cost/charge-beside-a-plain-descriptor",
		About: "a request of two descriptors, one charged (its own hits_addend), the other plain (the request's): the charge " +
			"is counted even when the plain one is over",
		Configs: []string{"cost.yaml"},
		Steps: []Step{
			step("plain, and a charge of 6", req("cost", D(E("requests", "w")), tok("w", 6)), answer(ok(requests, 2), ok(tokens, 4))),
			step("plain, and a check", req("cost", D(E("requests", "w")), tok("w", 0)), answer(ok(requests, 1), ok(tokens, 4))),
			step("plain alone", req("cost", D(E("requests", "w"))), answer(ok(requests, 0))),
			step("plain over, and a charge of 3: counted", req("cost", D(E("requests", "w")), tok("w", 3)), answer(over(requests), ok(tokens, 1))),
			step("a check", req("cost", tok("w", 0)), answer(ok(tokens, 1))),
			step("a charge of 2 passes the limit", req("cost", tok("w", 2)), answer(over(tokens))),
			step("a check", req("cost", tok("w", 0)), answer(over(tokens))),
		},
	}, {
		Name: "cost/over-check-beside-a-plain-descriptor",
		About: "a request of a plain descriptor and a check that is over: the request is OVER_LIMIT, and the peer counts " +
			"the plain descriptor's hit all the same",
		Configs: []string{"cost.yaml"},
		Steps: []Step{
			step("a charge of 12 of 10", req("cost", tok("v", 12)), answer(over(tokens))),
			step("plain, and the check", req("cost", D(E("requests", "v")), tok("v", 0)), answer(ok(requests, 2), over(tokens))),
			step("plain alone: the refused request's hit counted", req("cost", D(E("requests", "v"))), answer(ok(requests, 1))),
		},
	}}
}

func overrideSequences() []Sequence {
	k := lim(5, Minute)
	kd := func(v string) Descriptor { return D(E("k", v)) }
	two, three, oneHour, oneMinute := lim(2, Minute), lim(3, Minute), lim(1, Hour), lim(1, Minute)
	return []Sequence{{
		Name: "override/limits-a-descriptor",
		About: "a descriptor's own limit (the override) replaces the rule's: current_limit is the override, with no name, " +
			"counted and refused like a rule",
		Configs: []string{"addend.yaml"},
		Steps:   countdown("override 2/minute", 3, req("addend", withLimit(kd("g"), two)), two),
	}, {
		Name: "override/shares-the-counter",
		About: "an override counts on the descriptor's counter (the counter is the entries and the window, not the limit): " +
			"2 hits under the rule's 5, then one under an override of 3 leaves 0, and the rule's next hit leaves 1",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("the rule", req("addend", kd("h")), answer(ok(k, 4))),
			step("the rule again", req("addend", kd("h")), answer(ok(k, 3))),
			step("override 3/minute", req("addend", withLimit(kd("h"), three)), answer(ok(three, 0))),
			step("the rule once more", req("addend", kd("h")), answer(ok(k, 1))),
		},
	}, {
		Name: "override/beyond-the-rules",
		About: "an override applies to a descriptor that no rule matches, and over an unlimited or a shadow_mode rule " +
			"(neither mode applies to it); in an unknown domain it does not apply at all",
		Configs: []string{"addend.yaml", "modes.yaml"},
		Steps: cat(
			countdown("no rule, override 1/hour", 2, req("addend", withLimit(D(E("nomatch", "x")), oneHour)), oneHour),
			countdown("two entries, no rule", 2, req("addend", withLimit(D(E("a", "1"), E("b", "2")), oneMinute)), oneMinute),
			countdown("an unlimited rule", 2, req("modes", withLimit(D(E("unlimited", "o")), oneMinute)), oneMinute),
			countdown("a shadow_mode rule", 2, req("modes", withLimit(D(E("shadow", "o")), oneMinute)), oneMinute),
			repeat("unknown domain", 2, req("no-such-domain", withLimit(kd("x"), oneMinute)), func(int) Want { return answer(noLimit) }),
		),
	}}
}

func errorSequences() []Sequence {
	return []Sequence{{
		Name:    "errors/bad-requests",
		About:   "an empty domain, or no descriptors, fails the call with gRPC status Unknown",
		Configs: []string{"addend.yaml"},
		Steps: []Step{
			step("empty domain", one("", "k", "a"), Want{Err: codes.Unknown}),
			step("no descriptors", req("addend"), Want{Err: codes.Unknown}),
			step("still serving", one("addend", "k", "a"), answer(ok(lim(5, Minute), 4))),
		},
	}}
}
