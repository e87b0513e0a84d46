//go:build js && wasm

// Command regions is the engine of the browser's regions page (web/assets/regions.html): package
// sim/regions compiled to WebAssembly, the code `sluice simulate --regions` runs — each region
// deciding its requests through decision.Decider, its allotment from a region.Refresher, on the
// Go ledger, on a virtual clock. It is a program of its own, loaded only by the regions page, so
// that the main page's sluice.wasm stays as light as it is. scripts/build-web.sh builds it into
// web/assets/regions.wasm.
//
// It sets globalThis.sluiceRegions to an object of functions, then calls
// globalThis.sluiceRegionsReady():
//
//	run(query)   runs the simulation of a URL query string whose keys are simulate's flags of
//	             the regions mode (regions.QueryKeys: regions=eu,us,ap&traffic=...&limit=...);
//	             returns the JSON of `sluice simulate --regions --format json`, or
//	             {"errors": [{"field": "traffic", "message": "..."}, ...]} naming the fields
//
// Every function returns a string, and recovers from a panic into {"errors": [...]}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"syscall/js"

	"github.com/sluicehq/sluice/sim/regions"
)

type fieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func errorsJSON(errs ...error) string {
	out := struct {
		Errors []fieldError `json:"errors"`
	}{}
	for _, err := range errs {
		var oe *regions.OptionError
		if errors.As(err, &oe) {
			out.Errors = append(out.Errors, fieldError{oe.Field, oe.Message})
		} else {
			out.Errors = append(out.Errors, fieldError{"", err.Error()})
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func run(query string) string {
	o, errs := regions.ParseQuery(query)
	if errs != nil {
		return errorsJSON(errs...)
	}
	res, err := regions.Run(o)
	if err != nil {
		return errorsJSON(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return errorsJSON(err)
	}
	return string(b)
}

func main() {
	api := js.Global().Get("Object").New()
	api.Set("run", js.FuncOf(func(this js.Value, args []js.Value) (result any) {
		defer func() {
			if r := recover(); r != nil {
				result = errorsJSON(fmt.Errorf("internal error: %v", r))
			}
		}()
		query := ""
		if len(args) > 0 && args[0].Type() == js.TypeString {
			query = args[0].String()
		}
		return run(query)
	}))
	js.Global().Set("sluiceRegions", api)
	if ready := js.Global().Get("sluiceRegionsReady"); ready.Type() == js.TypeFunction {
		ready.Invoke()
	}
	select {} // keep the functions alive for the page's lifetime
}
