package redis

import (
	"embed"
	"strings"

	"github.com/sluicehq/sluice/algorithm"
)

// The Lua scripts, one per algorithm, kept line for line parallel to package algorithm:
//
//	lua/common.lua          exact integer helpers, the state stamp, writes and TTLs
//	lua/<algorithm>.lua     one decide_<algorithm> function per file, mirroring algorithm/<algorithm>.go
//	lua/nth.lua             the argument checks and decisions of the scripts of several requests
//	lua/single.lua          the entry point of one decision
//	lua/multi.lua           the entry point of several limits on one client, all or nothing
//	lua/batch.lua           the entry point of several independent decisions (one slot on a cluster)
//
// A single decision's script is common + its algorithm + single; the multi script is common +
// all five + nth + multi (and the batch script the same with batch). Their contract (KEYS, ARGV, reply) is documented at the top of single.lua and
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

// multiScript returns the source of the script that decides several limits at once.
func multiScript() string { return allAlgorithms("lua/multi.lua") }

// batchScript returns the source of the script that decides a batch of independent requests.
func batchScript() string { return allAlgorithms("lua/batch.lua") }

func allAlgorithms(entry string) string {
	var b strings.Builder
	b.WriteString(luaFile("lua/common.lua"))
	for _, a := range algorithm.Algorithms {
		b.WriteString("\n")
		b.WriteString(luaFile(algorithmFiles[a]))
	}
	b.WriteString("\n")
	b.WriteString(luaFile("lua/nth.lua"))
	b.WriteString("\n")
	b.WriteString(luaFile(entry))
	return b.String()
}
