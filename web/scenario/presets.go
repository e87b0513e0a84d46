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
}
