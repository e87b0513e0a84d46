package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// clientName splits a segment that starts a client's own pattern, "NAME: segment", into the
// name (letters, digits, _ . -) and the rest; ok is false for any other segment. (By hand, not a
// package-level regexp, which the browser simulation, parsing clients too, would then link.)
func clientName(text string) (name, rest string, ok bool) {
	name, rest, ok = strings.Cut(text, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return "", "", false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return "", "", false
		}
	}
	return name, strings.TrimSpace(rest), true
}

// ParseClientTraffic returns the requests of a traffic pattern from several clients, merged in
// time order:
//
//	buggy: 300/min for 5m; normal: 20/min for 5m
//
// A segment that starts with "NAME:" (letters, digits, _ . -) begins client NAME's own pattern,
// at time 0; the segments after it, up to the next name, continue it, as in ParseTraffic
// ("buggy: 10 at once; idle 1s; 10 at once; normal: 1/s for 5s"). Segments before the first name
// are client DefaultKey's, so that a pattern without names is ParseTraffic's. Requests at the
// same instant keep the order in which their clients were named. A client may be named once;
// together the clients make at most MaxRequests requests. An error names the client and the
// segment.
func ParseClientTraffic(pattern string) ([]Request, error) {
	type client struct {
		name string
		segs []string
	}
	var clients []*client
	seen := map[string]bool{}
	named := false // some segment names a client (the default key, too)
	for _, text := range strings.Split(pattern, ";") {
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		if name, rest, ok := clientName(text); ok {
			if seen[name] {
				return nil, fmt.Errorf("traffic: client %q is named twice: give each client's segments after its one name", name)
			}
			seen[name] = true
			named = true
			clients = append(clients, &client{name: name})
			text = rest
		} else if len(clients) == 0 {
			seen[DefaultKey] = true
			clients = append(clients, &client{name: DefaultKey})
		}
		c := clients[len(clients)-1]
		c.segs = append(c.segs, text)
	}
	if !named {
		return ParseTraffic(pattern) // its requests, and its errors (an empty pattern's too)
	}
	var all []Request
	for _, c := range clients {
		reqs, err := ParseTraffic(strings.Join(c.segs, ";"))
		if err != nil {
			return nil, fmt.Errorf("traffic of client %q: %w", c.name, err)
		}
		if len(reqs) > MaxRequests-len(all) {
			return nil, fmt.Errorf("traffic of client %q: the clients would make more than %d requests (the most one simulation takes)", c.name, MaxRequests)
		}
		for i := range reqs {
			reqs[i].Key = c.name
		}
		all = append(all, reqs...)
	}
	// Stable: requests at one instant keep their clients' order, each client's in its own order.
	// (slices, not sort.SliceStable: it keeps the browser simulation's WebAssembly smaller.)
	slices.SortStableFunc(all, func(a, b Request) int { return cmp.Compare(a.TMicros, b.TMicros) })
	return all, nil
}
