package chattemplate

import "github.com/ardanlabs/jinja"

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
