package scenario

// Preset is a ready-made scenario of typical traffic.
type Preset struct {
	Name        string // a short identifier, e.g. "burst"
	Title       string // for the page's preset buttons
	Description string // what it shows, one or two sentences
	Query       string // the scenario, as Parse reads it
}

// Presets are the page's ready-made scenarios; the first is the one a bare address shows.
var Presets = []Preset{
	{
		Name:  "burst",
		Title: "5/s, then 40 in a second",
		Description: "A client sends 5 requests a second for 10 s, 40 in the next second, then 5 a second again; " +
			"the limit is 5 a second with a burst of 40. The token bucket takes the burst and the leaky bucket " +
			"queues it (up to 7 s of delay); the windows refuse most of it.",
		Query: "traffic=5/s+for+10s%3B+40+in+1s%3B+5/s+for+10s&limit=5&period=1s&burst=40",
	},
	{
		Name:  "minute-boundary",
		Title: "100 at 0:59, 100 at 1:00",
		Description: "The limit is 100 a minute. A client sends 100 requests at 59 s and 100 more at 60 s: the fixed " +
			"window counts them in two different minutes and allows all 200 within one second; the sliding " +
			"algorithms and the buckets allow about 100.",
		Query: "traffic=idle+59s%3B+100+at+once%3B+idle+1s%3B+100+at+once&limit=100&period=1m&burst=100",
	},
	{
		Name:  "screens",
		Title: "A screen opens: 8 requests at once",
		Description: "Each time a user opens a screen, it sends 8 requests at once (account, permissions, " +
			"notifications, data); then a script polls 3 times a second. The limit is 1 a second with a burst " +
			"of 10: the token bucket lets every screen through and holds the script to 1 a second; the windows " +
			"refuse most of each screen.",
		Query: "traffic=8+at+once%3B+idle+15s%3B+8+at+once%3B+idle+15s%3B+8+at+once%3B+idle+15s%3B+8+at+once%3B+idle+15s%3B+3/s+for+30s&limit=1&period=1s&burst=10",
	},
	{
		Name:  "calendar-day",
		Title: "10 a day, across a 23-hour day",
		Description: "One request an hour for three days from Saturday 2026-03-28 in Berlin, where Sunday has 23 hours " +
			"(the clocks skip from 02:00 to 03:00); the limit is 10 a day. The fixed window starts a new count at " +
			"each local midnight; the sliding window also weighs the previous day. Only these two count by the calendar.",
		Query: "traffic=72+in+72h&limit=10&calendar=day&time-zone=Europe/Berlin&start=2026-03-28T00:00:00%2B01:00",
	},
	{
		Name:  "tokens",
		Title: "Model tokens: charged 1, settled at 1–20",
		Description: "2 requests a second for 30 s; each is charged 1 token up front and settled at its real cost, 1 to 20 " +
			"tokens, once served. The limit is 100 tokens per 10 s: charged 1 each, all 60 would pass; settled at their " +
			"real costs, about half do — a larger cost takes the balance below zero, and the next requests wait.",
		Query: "traffic=2/s+for+30s&limit=100&period=10s&burst=100&actual=1-20&draw=1",
	},
	{
		Name:  "partners",
		Title: "A buggy partner and a normal one, 3 instances",
		Description: "A buggy partner sends 600 requests a minute, a normal one 20; the limit is 100 a minute for each, on " +
			"three instances behind a round-robin load balancer. With separate stores each instance counts alone, and " +
			"the fixed window lets 300 of the buggy partner's through, where 100 were meant; choose the shared store " +
			"and it is 100. The normal partner gets all 20 either way.",
		Query: "traffic=buggy:+600/min+for+1m%3B+normal:+20/min+for+1m&limit=100&period=1m&burst=0&instances=3&store=separate",
	},
}
