package chattemplate

// Limits bound the work of one Render. The engine cannot be interrupted and counts no steps, so
// the bounds are on what a client controls: the template is the operator's, and a template whose
// own loops are linear in the messages (every real one we know of, Qwen3's and Llama's included)
// then renders in time linear in the input. A template that nests loops over the messages costs
// O(MaxMessages²); MaxOutputBytes is checked when the render returns.
type Limits struct {
	MaxInputBytes  int // messages + tools + kwargs, as JSON
	MaxDepth       int // JSON nesting of any of them
	MaxMessages    int
	MaxOutputBytes int
	// MaxValues bounds the JSON values (strings, numbers, lists, objects, ...) of messages,
	// tools and kwargs together: their tree costs about 150 bytes a value, where a long string
	// costs its length. Zero is no limit.
	MaxValues int
}

// DefaultLimits are the limits Load sets.
func DefaultLimits() Limits {
	return Limits{MaxInputBytes: 64 << 20, MaxDepth: 128, MaxMessages: 10_000, MaxOutputBytes: 256 << 20, MaxValues: 100_000}
}

// WithLimits returns a copy of t that renders under l.
func (t *Template) WithLimits(l Limits) *Template {
	c := *t
	c.limits = l
	return &c
}

// Limits returns the limits t renders under.
func (t *Template) Limits() Limits { return t.limits }
