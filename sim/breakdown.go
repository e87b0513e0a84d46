package sim

// Breakdown totals a Fleet's run per instance and per client (key): what each instance let
// through to the backend, and what each client got, beside the run's Summary. Its memory grows
// with the distinct keys, which a simulation's own input bounds (MaxRequests).
type Breakdown struct {
	Instances []Summary       // [i] is instance i+1's
	Clients   []ClientSummary // in the order of each client's first request
	index     map[string]int  // key → its place in Clients
}

// ClientSummary is one client's requests' Summary.
type ClientSummary struct {
	Key     string
	Summary Summary
}

// NewBreakdown returns an empty Breakdown of a fleet of instances (0: no per-instance totals).
func NewBreakdown(instances int) *Breakdown {
	return &Breakdown{Instances: make([]Summary, instances), index: map[string]int{}}
}

// Add counts r into its instance's and its client's totals.
func (b *Breakdown) Add(r Row) {
	if r.Instance >= 1 && r.Instance <= len(b.Instances) {
		b.Instances[r.Instance-1].Add(r)
	}
	i, ok := b.index[r.Key]
	if !ok {
		i = len(b.Clients)
		b.index[r.Key] = i
		b.Clients = append(b.Clients, ClientSummary{Key: r.Key})
	}
	b.Clients[i].Summary.Add(r)
}
