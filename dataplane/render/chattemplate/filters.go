package chattemplate

import "github.com/epd-dev/coordinator/dataplane/render/jinja"

// The engine resolves a filter among its built-ins before the template's variables and cannot
// replace a built-in, so prepare renames the filters whose HF behaviour differs to variables that
// Render binds to our implementations.

// filterOverrides maps a built-in filter's name to the variable that replaces it.
var filterOverrides = map[string]string{
	"tojson": "__hf_tojson", // Python json.dumps: floats as repr, no \u2028 escapes, indent keeps key order
	"trim":   "__hf_trim",   // Python str.strip: also strips U+001C..U+001F; str(None) is "None"
}

// overrideFilters are the implementations behind filterOverrides' names.
var overrideFilters = map[string]jinja.Value{
	"tojson": jinja.NewCallable("tojson", filterToJSON),
	"trim":   jinja.NewCallable("trim", filterTrim),
}

// templateGlobals are the variables prepare's rewrites call (filterOverrides' replacements and
// strictHelpers), which every template is compiled with.
var templateGlobals = func() map[string]jinja.Value {
	g := make(map[string]jinja.Value, len(filterOverrides)+len(strictHelpers))
	for name, repl := range filterOverrides {
		g[repl] = overrideFilters[name]
	}
	for name, fn := range strictHelpers {
		g[name] = fn
	}
	return g
}()
