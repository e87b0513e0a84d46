package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCalendarSettleScriptArgs: the settle script checks a calendar settlement's window of at
// itself (ARGV[11]: two integers holding at), and a bad one is an error naming it that writes
// nothing; so is a now outside the windows passed (calendar.lua's error, on which the store asks
// again), checked before anything is written; a now before the recorded window (the clock ran
// back) settles in it — in the library's function and the script alike (SLUICE_LUA_SCRIPTS=1).
func TestCalendarSettleScriptArgs(t *testing.T) {
	e := newLuaEnv(t)
	ctx := context.Background()
	settle := luaRunner(fnRunner{newProgram(settleScript(), "settle")})
	decide := luaRunner(fnRunner{newProgram(calendarSingleScript(), "single_cal_1")})
	if luaScripts {
		settle, decide = newProgram(settleScript(), "settle").lua, newProgram(calendarSingleScript(), "single_cal_1").lua
	}
	day := int64(24 * time.Hour / time.Microsecond)
	t0 := int64(1_800_000_000_000_000) - int64(1_800_000_000_000_000)%day // a UTC midnight
	windows := fmt.Sprintf("day@UTC %d %d %d %d %d %d", t0-2*day, t0-day, t0, t0+day, t0+2*day, t0+3*day)
	at := t0 + 1000
	atWindow := fmt.Sprintf("%d %d", t0, t0+day)
	for _, alg := range []string{"1", "3"} {
		key := "rate-limit:{cal-settle-args-" + alg + "}:p"
		keys := luaKeys(key)
		if alg == "3" {
			decide = luaRunner(fnRunner{newProgram(calendarSingleScript(), "single_cal_3")})
			if luaScripts {
				decide = newProgram(calendarSingleScript(), "single_cal_3").lua
			}
		}
		if r, err := decide.Exec(ctx, e.c, keys, []string{alg, "10", windows, "0", "5", i64(at), i64(luaSlack)}).AsIntSlice(); err != nil || r[0] != 1 {
			t.Fatalf("the charge: %v %v", r, err)
		}
		state, err := e.c.Do(ctx, e.c.B().Get().Key(keys[0]).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		args := func(atArg, now, win string) []string {
			return []string{alg, "10", windows, "0", atArg, "5", "2", now, i64(luaSlack), "", win}
		}
		for _, c := range []struct {
			says  string // "": valid
			fresh bool   // on a key with no state
			args  []string
		}{
			{"at's window", false, args(i64(at), i64(at), "x y")},
			{"at's window", false, args(i64(at), i64(at), i64(t0))},
			{"at's window", false, args(i64(at), i64(at), fmt.Sprintf("%d %d", t0+day, t0+2*day))}, // not holding at
			{"at's window", false, args(i64(at), i64(at), fmt.Sprintf("%d %d", t0+day, t0))},
			{"at's window", false, args(i64(at), i64(at), fmt.Sprintf("%d %d", t0, 1<<62))},
			{"at's window", false, args(i64(at), i64(at), fmt.Sprintf("%d %d", -1<<62, t0+day))},
			{"at's window", false, args(i64(at), i64(at), "")},                // at without its window
			{"at ", false, args("1152921504606846976", i64(at), atWindow)},    // |at| ≥ 2^60
			{"calendar: time", false, args(i64(at), i64(t0+3*day), atWindow)}, // now at the last boundary: outside
			{"calendar: time", false, args("", i64(t0-3*day), "")},            // SettleNow, before them
			// Now two windows before the recorded one (the clock ran back): it is found, and the
			// charge refunded, as in the core; with no state, the sliding window's window before
			// now's is not known: an error, nothing written.
			{"", false, args(i64(at), i64(t0-2*day+5), atWindow)},
			{map[string]string{"1": "", "3": "calendar: time"}[alg], true, []string{alg, "10", windows, "0", "", "0", "2", i64(t0 - 2*day + 5), i64(luaSlack), "", ""}},
		} {
			k := keys
			if c.fresh {
				k = luaKeys(key + "-fresh")
				if err := e.c.Do(ctx, e.c.B().Del().Key(k...).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			} else if err := e.c.Do(ctx, e.c.B().Set().Key(keys[0]).Value(state).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			r, err := settle.Exec(ctx, e.c, k, c.args).AsIntSlice()
			if c.says == "" {
				if err != nil || r[0] != 1 {
					t.Errorf("alg %s, %q: %v %v; want a settlement", alg, c.args, r, err)
				}
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "sluice: "+c.says) {
				t.Errorf("alg %s, %q: error %v, want one saying %q", alg, c.args, err, c.says)
			}
			got, _ := e.c.Do(ctx, e.c.B().Get().Key(k[0]).Build()).ToString()
			if want := map[bool]string{false: state, true: ""}[c.fresh]; got != want {
				t.Errorf("alg %s, %q: the state %q became %q", alg, c.args, want, got)
			}
		}
		if err := e.c.Do(ctx, e.c.B().Set().Key(keys[0]).Value(state).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		// A valid one settles: 5 to 2, in the window of at.
		if r, err := settle.Exec(ctx, e.c, keys, args(i64(at), i64(at+1), atWindow)).AsIntSlice(); err != nil || r[0] != 1 {
			t.Fatalf("alg %s: a valid settlement: %v %v", alg, r, err)
		}
		want := fmt.Sprintf("%s 10 day@UTC %d 2", alg, t0)
		if alg == "3" {
			want += " 0"
		}
		if got, _ := e.c.Do(ctx, e.c.B().Get().Key(keys[0]).Build()).ToString(); got != want {
			t.Fatalf("alg %s: the state %q after settling, want %q", alg, got, want)
		}
	}
}
