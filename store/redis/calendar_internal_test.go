package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// TestCalendarScriptArgs: the scripts check a calendar period argument themselves, and an error
// names it and writes nothing — in the calendar single scripts, in the multi and the batch
// script (a valid limit first, this one second), and in the library's functions or the scripts
// alike (SLUICE_LUA_SCRIPTS=1). A now outside the windows passed is an error reply of the single
// and multi scripts, writing nothing, and a -2 decision of the batch script, whose other
// decisions are made.
func TestCalendarScriptArgs(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	prog := func(p *program) luaRunner {
		if luaScripts {
			return p.lua
		}
		return fnRunner{p}
	}
	calSingle := map[string]luaRunner{}
	for _, a := range calendarAlgorithms {
		calSingle[fmt.Sprint(int(a))] = prog(newProgram(calendarSingleScript(), "single_cal_"+fmt.Sprint(int(a))))
	}
	day := int64(24 * time.Hour / time.Microsecond)
	t0 := int64(1_800_000_000_000_000) - int64(1_800_000_000_000_000)%day // a UTC midnight
	ok := fmt.Sprintf("day@UTC %d %d %d %d %d %d", t0-2*day, t0-day, t0, t0+day, t0+2*day, t0+3*day)
	now := fmt.Sprint(t0 + 1000)
	type call struct {
		name string // the argument the error must name ("" if the call is valid)
		args []string
	}
	calls := []call{
		{"period", []string{"1", "10", "day@UTC 200 100", "0", "1", now, "0"}},               // not increasing
		{"period", []string{"1", "10", "day@UTC 100 100", "0", "1", now, "0"}},               // not strictly
		{"period", []string{"1", "10", "day@UTC 100", "0", "1", now, "0"}},                   // one boundary is no window
		{"period", []string{"1", "10", "day@UTC", "0", "1", now, "0"}},                       // none
		{"period", []string{"1", "10", "Day@UTC 1 2", "0", "1", now, "0"}},                   // the token's spelling
		{"period", []string{"1", "10", "day@Europe Berlin 1 2", "0", "1", now, "0"}},         // a space in the zone
		{"period", []string{"1", "10", "day@UTC 1e3 2000", "0", "1", now, "0"}},              // digits only
		{"period", []string{"1", "10", "day@UTC 1 2 x", "0", "1", now, "0"}},                 // digits only
		{"period", []string{"3", "10", "day@UTC 1 - 3", "0", "1", now, "0"}},                 // a lone minus
		{"period", []string{"3", "10", "day@UTC 1 4611686018427387904", "0", "1", now, "0"}}, // 2^62
		{"period", []string{"3", "10", "day@UTC -4611686018427387904 1", "0", "1", now, "0"}},
		{"period", []string{"1", "10", "day@UTC 9007199254740993 9007199254740993", "0", "1", now, "0"}}, // equal, as big ints
		{"period", []string{"1", "10", "day@UTC 1 " + strings.Repeat("1", 21), "0", "1", now, "0"}},
		{"period", []string{"4", "10", ok, "0", "1", now, "0"}}, // a calendar for a token bucket
		{"period", []string{"2", "10", ok, "0", "1", now, "0"}}, // or a sliding log
		{"burst", []string{"1", "10", ok, "1", "1", now, "0"}},
		{"cost", []string{"1", "10", ok, "0", "11", now, "0"}},
		{"cost", []string{"3", "10", ok, "0", "-1", now, "0"}},
		{"limit", []string{"1", "0", ok, "0", "1", now, "0"}},
		{"calendar", []string{"1", "10", ok, "0", "1", fmt.Sprint(t0 + 3*day), "0"}}, // at the last boundary: outside
		{"calendar", []string{"3", "10", ok, "0", "1", fmt.Sprint(t0 - 2*day), "0"}}, // sliding: no window before it
		{"calendar", []string{"3", "10", ok, "0", "1", fmt.Sprint(t0 + 2*day), "0"}}, // sliding: no window after the next
		{"calendar", []string{"1", "10", ok, "0", "1", "1152921504606846975", "0"}},  // far beyond (a big int)
		{"calendar", []string{"1", "10", "day@UTC 9007199254740993 9007199254740994", "0", "1", "9007199254740994", "0"}},
		{"", []string{"1", "10", ok, "0", "1", fmt.Sprint(t0 - 2*day), "0"}},     // fixed: any window passed
		{"", []string{"1", "10", ok, "0", "1", fmt.Sprint(t0 + 3*day - 1), "0"}}, // the last µs
		{"", []string{"3", "10", ok, "0", "1", fmt.Sprint(t0 - day), "0"}},       // sliding: windows -1 ..
		{"", []string{"3", "10", ok, "0", "1", fmt.Sprint(t0 + 2*day - 1), "0"}}, // .. +1
		{"", []string{"1", "10", "week@America/Argentina/Buenos_Aires 1 2", "0", "1", "1", "0"}},
		{"", []string{"3", "10", "year@Etc/GMT+5 -3 -2 -1 0", "0", "1", "-2", "0"}},
		{"", []string{"3", "10", "day@UTC 9007199254740990 9007199254740993 9007199254740996 9007199254740999", "0", "1", "9007199254740994", "0"}}, // beyond 2^53
		{"", []string{"1", "10", "day@UTC -4611686018427387903 4611686018427387903", "0", "1", "-1152921504606846975", "0"}},
	}
	for i, c := range calls {
		key := fmt.Sprintf("rate-limit:{cal-args-%d}:p", i)
		keys := luaKeys(key)
		other := fmt.Sprintf("rate-limit:{cal-args-%d}:other", i)
		multi := append(append([]string{"2", c.args[5], c.args[6], "1", "5", "1000000", "0", "1", "-1", "0"}, c.args[:5]...), "-1", "0", "")
		two := append(append([]string{"2", c.args[5], c.args[6], "1", "5", "1000000", "0", "1"}, c.args[:5]...), "", "")
		results := map[string]error{
			"multi": e.multi.Exec(ctx, e.c, append(luaKeys(other), keys...), multi).Error(),
		}
		var batchReply []int64
		if c.name != "calendar" {
			results["batch"] = e.batch.Exec(ctx, e.c, append(luaKeys(other), keys...), two).Error()
		} else {
			r, err := e.batch.Exec(ctx, e.c, append(luaKeys(other), keys...), two).AsIntSlice()
			if err != nil || len(r) != 13 || r[0] != 1 || r[6] != -2 {
				t.Errorf("batch script, %q: %v %v; want the first decision made and the second -2", c.args, r, err)
			}
			batchReply = r
		}
		if s, ok := calSingle[c.args[0]]; ok {
			results["single"] = s.Exec(ctx, e.c, keys, c.args).Error()
		}
		for script, err := range results {
			if c.name == "" {
				if err != nil {
					t.Errorf("%s script, %q: %v", script, c.args, err)
				}
				continue
			}
			if err == nil || !(strings.Contains(err.Error(), "sluice: "+c.name+" ") || strings.Contains(err.Error(), "sluice: "+c.name+": ")) {
				t.Errorf("%s script, %q: error %v, want one naming %s", script, c.args, err, c.name)
			}
		}
		if c.name != "" {
			n, _ := e.c.Do(ctx, e.c.B().Exists().Key(keys...).Build()).AsInt64()
			if batchReply == nil {
				m, _ := e.c.Do(ctx, e.c.B().Exists().Key(luaKeys(other)...).Build()).AsInt64()
				n += m
			}
			if n != 0 {
				t.Errorf("%q: a refused call left %d keys", c.args, n)
			}
		}
	}
	// A calendar argument to a single script that decides no calendar, or µs to a calendar
	// script (the store never sends either), is refused as a period, not read as one.
	for _, c := range []struct {
		s    luaRunner
		args []string
	}{
		{e.single[algorithm.FixedWindow], []string{"1", "10", ok, "0", "1", now, "0"}},
		{e.single[algorithm.SlidingWindow], []string{"3", "10", ok, "0", "1", now, "0"}},
		{calSingle["1"], []string{"1", "10", "86400000000", "0", "1", now, "0"}},
		{calSingle["3"], []string{"3", "10", "86400000000", "0", "1", now, "0"}},
	} {
		err := c.s.Exec(ctx, e.c, luaKeys("rate-limit:{cal-args}:plain"), c.args).Error()
		if err == nil || !strings.Contains(err.Error(), "sluice: period ") {
			t.Fatalf("%q: %v; want an error naming the period", c.args, err)
		}
	}
}
