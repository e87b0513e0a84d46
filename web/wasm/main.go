//go:build js && wasm

// Command wasm is the browser simulation's engine: sluice's core, memory store and simulator
// compiled to WebAssembly, so that the page decides every request with the very code that
// `sluice simulate` and the gateway run. scripts/build-web.sh builds it into
// web/assets/sluice.wasm.
//
// It sets globalThis.sluice to an object of functions, then calls globalThis.sluiceReady():
//
//	run(query)          runs the scenario of a URL query string; returns the JSON of
//	                    scenario.Result.JSON, or {"errors": [...]} naming the fields at fault
//	summaries(k)        the JSON array of each algorithm's summary of the first k buckets of the
//	                    last successful run (scenario.Result.SummariesJSON)
//	instances(k)        with a fleet (instances=3&store=separate): the JSON array, per run, of
//	                    what each instance let through in the first k buckets
//	                    (scenario.Result.InstancesJSON); empty arrays for one instance
//	clients(k)          when the traffic names clients ("buggy: ...; normal: ..."): the JSON
//	                    array, per run, of what each client got in the first k buckets, in all
//	                    and per instance (scenario.Result.ClientsJSON)
//	trace()             the last successful run's requests as a CSV trace for `sluice simulate --trace`
//	generate(query)     {"pattern": "..."} from the traffic generator's fields, or {"errors": [...]}
//	presets()           the JSON array of scenario.Presets
//	instant(us)         virtual time us of the last successful run as a person reads it, in its
//	                    calendar's zone or its start's offset ("Sun 2026-03-29 03:00:00 +02:00"),
//	                    or "" for a run from Unix time 0 without a calendar
//
// Every function returns a string. A Go panic would end the program and break every later call,
// so each call recovers and answers {"errors": [...]} instead.
package main

import (
	"encoding/json"
	"fmt"
	"syscall/js"
	_ "time/tzdata" // the IANA zones of calendar scenarios: a browser has no /usr/share/zoneinfo

	"github.com/sluicehq/sluice/web/scenario"
)

// last is the last scenario that ran; summaries, instances, clients, trace and instant read it.
// The page is single-threaded: every call comes from the JavaScript event loop, one at a time.
var last *scenario.Result

func main() {
	api := js.Global().Get("Object").New()
	api.Set("run", fn(func(args []js.Value) string {
		sc, errs := scenario.Parse(stringArg(args, 0))
		if errs != nil {
			return string(errs.JSON())
		}
		res, errs := sc.Run()
		if errs != nil {
			return string(errs.JSON())
		}
		last = res
		return string(res.JSON())
	}))
	api.Set("summaries", firstBuckets((*scenario.Result).SummariesJSON))
	api.Set("instances", firstBuckets((*scenario.Result).InstancesJSON))
	api.Set("clients", firstBuckets((*scenario.Result).ClientsJSON))
	api.Set("trace", fn(func([]js.Value) string {
		if last == nil {
			return ""
		}
		return string(last.Trace())
	}))
	api.Set("generate", fn(func(args []js.Value) string {
		g, errs := scenario.ParseGenerator(stringArg(args, 0))
		if errs != nil {
			return string(errs.JSON())
		}
		pattern, errs := g.Pattern()
		if errs != nil {
			return string(errs.JSON())
		}
		b, _ := json.Marshal(struct {
			Pattern string `json:"pattern"`
		}{pattern})
		return string(b)
	}))
	api.Set("presets", fn(func([]js.Value) string { return string(scenario.PresetsJSON()) }))
	api.Set("instant", fn(func(args []js.Value) string {
		if last == nil || len(args) == 0 || args[0].Type() != js.TypeNumber {
			return ""
		}
		return last.Scenario.Instant(int64(args[0].Float()))
	}))
	js.Global().Set("sluice", api)

	if ready := js.Global().Get("sluiceReady"); ready.Type() == js.TypeFunction {
		ready.Invoke()
	}
	select {} // keep the functions alive for the page's lifetime
}

// fn wraps f as a JavaScript function that returns a string and never lets a panic end the
// program.
func fn(f func(args []js.Value) string) js.Func {
	return js.FuncOf(func(this js.Value, args []js.Value) (result any) {
		defer func() {
			if r := recover(); r != nil {
				result = string(scenario.Errors{{Field: "", Message: fmt.Sprintf("internal error: %v", r)}}.JSON())
			}
		}()
		return f(args)
	})
}

// firstBuckets wraps of, a JSON of the last run's first k buckets, as a function of k (0 if
// not a number); "[]" before any run.
func firstBuckets(of func(r *scenario.Result, k int) []byte) js.Func {
	return fn(func(args []js.Value) string {
		if last == nil {
			return "[]"
		}
		k := 0
		if len(args) > 0 && args[0].Type() == js.TypeNumber {
			k = args[0].Int()
		}
		return string(of(last, k))
	})
}

func stringArg(args []js.Value, i int) string {
	if i < len(args) && args[i].Type() == js.TypeString {
		return args[i].String()
	}
	return ""
}
