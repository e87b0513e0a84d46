package redis

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/algorithm"
)

// The Lua scripts, one per algorithm, kept line for line parallel to package algorithm:
//
//	lua/common.lua          exact integer helpers, the state stamp, writes and TTLs
//	lua/<algorithm>.lua     one decide_<algorithm> function per file, mirroring algorithm/<algorithm>.go
//	lua/calendar.lua        the fixed and sliding window on calendar windows passed by the store
//	lua/nth.lua             the argument checks and decisions of the scripts of several requests
//	lua/single.lua          the entry point of one decision
//	lua/multi.lua           the entry point of several limits on one client, all or nothing
//	lua/batch.lua           the entry point of several independent decisions (one slot on a cluster)
//	lua/settle.lua          the entry point of a settlement (a charge's real cost, known after its response)
//	lua/conc.lua            the entry point of a request's limits when some are concurrency limits
//	lua/lease.lua           releases and renewals of concurrency leases (common + it)
//
// A single decision's script is common + its algorithm + single (a calendar policy's: common +
// calendar + single, deciding with its calendar deciders); the multi script is common + all five +
// calendar + nth + multi (and the batch script the same with batch). Their contract (KEYS, ARGV, reply) is documented at the top of single.lua and
// multi.lua.
//
//go:embed lua/*.lua
var luaFiles embed.FS

var algorithmFiles = map[algorithm.Algorithm]string{
	algorithm.FixedWindow:   "lua/fixed_window.lua",
	algorithm.SlidingLog:    "lua/sliding_log.lua",
	algorithm.SlidingWindow: "lua/sliding_window.lua",
	algorithm.TokenBucket:   "lua/token_bucket.lua",
	algorithm.LeakyBucket:   "lua/leaky_bucket.lua",
}

func luaFile(name string) string {
	b, err := luaFiles.ReadFile(name)
	if err != nil {
		panic("store/redis: embedded script missing: " + name) // a build error, not input
	}
	return string(b)
}

// singleScript returns the source of the script that decides one request under a.
func singleScript(a algorithm.Algorithm) string {
	return luaFile("lua/common.lua") + "\n" + luaFile(algorithmFiles[a]) + "\n" + luaFile("lua/single.lua")
}

// calendarSingleScript returns the source of the script that decides one request of a calendar
// policy under a (fixed-window or sliding-window): single.lua on calendar.lua's deciders.
func calendarSingleScript() string {
	return luaFile("lua/common.lua") + "\n" + luaFile("lua/calendar.lua") + "\n" + calendarEntry + luaFile("lua/single.lua")
}

// calendarEntry starts single.lua's code where it is to decide calendar policies: its deciders
// are calendar.lua's.
const calendarEntry = "local deciders, calendar_entry = cal_deciders, true\n"

// multiScript returns the source of the script that decides several limits at once.
func multiScript() string { return allAlgorithms("lua/multi.lua") }

// batchScript returns the source of the script that decides a batch of independent requests.
func batchScript() string { return allAlgorithms("lua/batch.lua") }

// settleScript returns the source of the script that settles a charge (settle.go).
func settleScript() string { return allAlgorithms("lua/settle.lua") }

func allAlgorithms(entry string) string {
	var b strings.Builder
	writeAllAlgorithms(&b)
	b.WriteString("\n")
	b.WriteString(luaFile(entry))
	return b.String()
}

// writeAllAlgorithms writes what the scripts of several requests share to b: common.lua, every
// algorithm's file and nth.lua.
func writeAllAlgorithms(b *strings.Builder) {
	b.WriteString(luaFile("lua/common.lua"))
	for _, a := range algorithm.Algorithms {
		b.WriteString("\n")
		b.WriteString(luaFile(algorithmFiles[a]))
	}
	b.WriteString("\n")
	b.WriteString(luaFile("lua/calendar.lua"))
	b.WriteString("\n")
	b.WriteString(luaFile("lua/nth.lua"))
}

// THE LIBRARY (Redis ≥ 7.0). A script's chunk runs whole on every EVALSHA: before it decides
// anything it makes again every local function of common.lua and the algorithm files (closures:
// several µs of Redis's CPU per call). Redis Functions run a library's chunk once, at FUNCTION
// LOAD, and each FCALL only calls a function it registered. So the same files are also assembled
// as one library — common.lua, all five algorithm files, nth.lua, and each entry file as the body
// of a function — whose registered functions are the scripts, with their KEYS, ARGV and replies:
//
//	<lib>_single_<alg>   single.lua for algorithm alg (1..5), refusing any other as its script does
//	<lib>_single_cal_<alg>  the calendar single script for alg (1 fixed-window, 3 sliding-window)
//	<lib>_multi          multi.lua
//	<lib>_batch          batch.lua
//	<lib>_settle         settle.lua
//
// <lib> is sluice_<the first 16 hex digits of the library's SHA-1>: a version that changes with
// every change to the scripts, so that instances of two versions (a rolling upgrade) each find
// their own functions in one Redis, as they find their own scripts by SHA-1. A function's locals
// persist between calls, unlike a script's: the entry resets the two that a call may leave set
// (W, the limb code, built only for ints beyond 2^53, and stale, the keys a call found stale),
// so that every call starts as a script's does; the others are caches of pure functions
// (last_stamp) or filled before they are read (nth_args).
//
// The store loads the library at connection and again on "Function not found" (a restart, a
// failover to a node that never had it, a new cluster node, FUNCTION FLUSH), then calls again
// once, as rueidis re-sends a script as EVAL after NOSCRIPT (funcs.go).
var library = buildLibrary()

type libraryCode struct {
	name, code string
}

func buildLibrary() libraryCode {
	var b strings.Builder
	b.WriteString("local KEYS, ARGV -- set by each entry below: a function gets them as arguments, not globals\n")
	writeAllAlgorithms(&b)
	for _, e := range []string{"single", "multi", "batch", "settle", "conc", "lease"} {
		b.WriteString("\nlocal function entry_" + e + "()\n")
		b.WriteString(luaFile("lua/" + e + ".lua"))
		b.WriteString("\nend\n")
	}
	b.WriteString("\nlocal function entry_single_cal()\n" + calendarEntry)
	b.WriteString(luaFile("lua/single.lua"))
	b.WriteString("\nend\n")
	body := b.String()
	sum := sha1.Sum([]byte(body))
	name := "sluice_" + hex.EncodeToString(sum[:8])
	b.Reset()
	b.WriteString("#!lua name=" + name + "\n")
	b.WriteString(body)
	b.WriteString(`
local function entry(run, alg)
  return function(keys, args)
    KEYS, ARGV, W, stale = keys, args, nil, {}
    if alg ~= nil and tonumber(ARGV[1]) ~= alg then
      return redis.error_reply('ERR sluice: this script does not decide algorithm ' .. tostring(ARGV[1]))
    end
    return run()
  end
end
`)
	for _, a := range algorithm.Algorithms {
		n := strconv.Itoa(int(a))
		b.WriteString("redis.register_function('" + name + "_single_" + n + "', entry(entry_single, " + n + "))\n")
	}
	for _, a := range calendarAlgorithms {
		n := strconv.Itoa(int(a))
		b.WriteString("redis.register_function('" + name + "_single_cal_" + n + "', entry(entry_single_cal, " + n + "))\n")
	}
	b.WriteString("redis.register_function('" + name + "_multi', entry(entry_multi))\n")
	b.WriteString("redis.register_function('" + name + "_batch', entry(entry_batch))\n")
	b.WriteString("redis.register_function('" + name + "_settle', entry(entry_settle))\n")
	b.WriteString("redis.register_function('" + name + "_conc', entry(entry_conc))\n")
	b.WriteString("redis.register_function('" + name + "_lease', entry(entry_lease))\n")
	return libraryCode{name: name, code: b.String()}
}

// program is one of the store's scripts, with the library function that does the same.
type program struct {
	lua        *rueidis.Lua // EVALSHA, EVAL after NOSCRIPT (auto-pipelined)
	text, sha1 string       // the script, for the dedicated connections of replicas_ack
	fn         string       // the library's function
}

func newProgram(text, fn string) *program {
	sum := sha1.Sum([]byte(text))
	return &program{lua: rueidis.NewLuaScript(text), text: text, sha1: hex.EncodeToString(sum[:]), fn: library.name + "_" + fn}
}
