package scenario

import (
	"encoding/json"
	"strings"
	"testing"
)

// A scenario's changes travel in its address, give its command lines --change, and move the
// state plots' ceiling from their instant on.
func TestChanges(t *testing.T) {
	const q = "traffic=10/s+for+20s&limit=5&period=1s&burst=10&change=t%3D8s%2Climit%3D20&change=t%3D12s%2Cburst%3D4"
	sc := mustParse(t, q)
	if got := mustParse(t, sc.Encode()); got.Encode() != sc.Encode() || len(got.Changes) != 2 || got.Changes[0].TMicros != 8e6 {
		t.Errorf("Encode %q parses back to %+v", sc.Encode(), got.Changes)
	}
	if cmd := sc.Commands()[0]; !strings.Contains(cmd, " --change t=8s,limit=20 --change t=12s,burst=4 ") {
		t.Errorf("command %q: want the changes in time order", cmd)
	}
	res := mustRun(t, sc)
	for _, run := range res.Runs {
		at := func(us int64) int64 { return run.Ceiling[us/res.WidthMicros] }
		want := [3]int64{5, 20, 20} // before 8s, from 8s, from 12s
		switch run.Policy.Algorithm.String() {
		case "token-bucket":
			want = [3]int64{10, 10, 4}
		case "leaky-bucket":
			want = [3]int64{11, 11, 5}
		}
		if got := [3]int64{at(7e6), at(8e6), at(12e6)}; got != want {
			t.Errorf("%v: ceiling at 7s, 8s, 12s = %v, want %v", run.Policy.Algorithm, got, want)
		}
	}
	// The page's JSON gives each run the policy from each change on, so that a card says what
	// runs now: the limit, the burst, the capacity and the words.
	var doc struct {
		Runs []struct {
			Algorithm string `json:"algorithm"`
			Phases    []struct {
				TUs         int64  `json:"t_us"`
				Limit       int64  `json:"limit"`
				Burst       int64  `json:"burst"`
				Capacity    int64  `json:"capacity"`
				Description string `json:"description"`
			} `json:"phases"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(res.JSON(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, run := range doc.Runs {
		ph := run.Phases
		if len(ph) != 2 || ph[0].TUs != 8e6 || ph[1].TUs != 12e6 || ph[0].Limit != 20 || ph[1].Limit != 20 {
			t.Errorf("%s: phases %+v", run.Algorithm, ph)
			continue
		}
		switch run.Algorithm {
		case "token-bucket":
			if ph[0].Capacity != 10 || ph[1].Burst != 4 || ph[1].Capacity != 4 ||
				ph[1].Description != "A bucket of 4 tokens, refilled 20 per 1s; a request takes a token or is refused." {
				t.Errorf("token-bucket: phases %+v", ph)
			}
		case "fixed-window":
			if ph[1].Burst != 0 || ph[1].Capacity != 20 || !strings.HasPrefix(ph[0].Description, "At most 20 in each 1s window") {
				t.Errorf("fixed-window: phases %+v", ph)
			}
		}
	}
	if strings.Contains(string(mustRun(t, mustParse(t, "traffic=10/s+for+2s&limit=5&period=1s")).JSON()), `"phases"`) {
		t.Error("a run without changes has phases")
	}

	for query, want := range map[string]string{
		q + "&change=t%3D1s":                         "change: \"t=1s\": want t=D and limit=N or burst=N",
		q + "&instances=3&store=shared":              "change: applies to one instance",
		q + "&change=t%3D13s%2Cburst%3D1e15":         "change: burst=1e15: ",
		q + "&change=t%3D13s%2Cburst%3D999999999999": "change: t=13s,burst=999999999999: token-bucket: ",
	} {
		if _, errs := Parse(query); errs == nil || !strings.Contains(errs.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", query, errs, want)
		}
	}
}
