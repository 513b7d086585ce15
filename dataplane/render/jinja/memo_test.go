package jinja

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// mapMemo is a Memo in a map, counting what it keeps and noting the loops it is asked about and
// the outputs (their strings' addresses) of every iteration it was given.
type mapMemo struct {
	m     map[IterationKey]*Iteration
	kept  int
	asked map[*Loop]bool
	outs  map[*byte]bool
}

func (m *mapMemo) Iterations(loop *Loop, items []Value, found []*Iteration) {
	if m.asked == nil {
		m.asked = map[*Loop]bool{}
	}
	m.asked[loop] = true
	for i, item := range items {
		found[i] = nil
		if item.IsDict() {
			found[i] = m.m[IterationKey{Loop: loop, Item: item.AsDict()}]
		}
	}
}

func (m *mapMemo) Keep(loop *Loop, its []*Iteration) {
	if m.m == nil {
		m.m = map[IterationKey]*Iteration{}
	}
	if loop.silent {
		panic("an iteration of a loop that outputs nothing kept")
	}
	for _, it := range its {
		if it.Size(1<<20) <= 0 {
			panic("an iteration of no size")
		}
		m.kept++
		m.m[IterationKey{Loop: loop, Item: it.Item()}] = it
		if m.outs == nil {
			m.outs = map[*byte]bool{}
		}
		m.outs[unsafe.StringData(it.out)] = true
	}
}

// checkSpans fails t unless spans are in order, apart, each rest's bytes at its offset and the
// very string (by address) of an iteration memo was given.
func checkSpans(t *testing.T, memo *mapMemo, rest string, spans []Span) {
	t.Helper()
	at := 0
	for i, s := range spans {
		if s.At < at || s.At+len(s.Text) > len(rest) || rest[s.At:s.At+len(s.Text)] != s.Text {
			t.Fatalf("span %d of %d, %q at %d, is not rest's bytes after the span before (rest %q)", i, len(spans), s.Text, s.At, rest)
		}
		if !memo.outs[unsafe.StringData(s.Text)] {
			t.Fatalf("span %d, %q at %d, is not an iteration's own string", i, s.Text, s.At)
		}
		at = s.At + len(s.Text)
	}
}

// memoTemplates are templates whose loops over messages read, write and output in the ways a
// memoized iteration must replay exactly, or must not be replayed at all.
var memoTemplates = []struct {
	name, src string
	// replayed: the later turns replay some iterations (false: none may be kept or found).
	replayed bool
}{
	{"plain", `{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}`, true},
	{"index and first", `{% for m in messages %}{% if loop.first %}{{ bos }}{% endif %}{{ loop.index0 }}:{{ m['content'] }};{% endfor %}`, true},
	{"last", `{% for m in messages %}{{ m.content }}{% if loop.last %}[end]{% endif %}|{% endfor %}`, true},
	{"length", `{% for m in messages %}{{ loop.length }}{{ m.content }}{% endfor %}`, false},
	{"revindex", `{% for m in messages %}{{ loop.revindex0 }}{% endfor %}`, false},
	{"nextitem", `{% for m in messages %}{% if loop.nextitem is defined %}{{ loop.nextitem.role }}{% endif %}{{ m.content }}{% endfor %}`, true},
	{"neighbours", `{% for m in messages %}{% if loop.index0 == 0 or messages[loop.index0 - 1].role != m.role %}[{{ m.role }}]{% endif %}{{ m.content }}{% if loop.last or messages[loop.index0 + 1].role != m.role %}[/]{% endif %}{% endfor %}`, true},
	{"messages length", `{% for m in messages %}{{ messages|length }}{{ m.content }}{% endfor %}`, false},
	{"messages last", `{% for m in messages %}{% if m == messages[-1] %}*{% endif %}{{ m.content }}{% endfor %}`, true},
	{"messages last output", `{% for m in messages %}{{ m == messages[-1] }}{{ m.content }}{% endfor %}`, false},
	{"namespace counter", `{% set ns = namespace(n=0, seen='') %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endif %}{% set ns.seen = ns.seen + m.role[0] %}{{ ns.n }}{{ ns.seen[-3:] }}{{ m.content }}{% endfor %}{{ ns.n }}/{{ ns.seen }}`, true},
	{"reverse scan", `{% set ns = namespace(last=messages|length - 1, on=true) %}{% for m in messages[::-1] %}{% if ns.on and m.role == 'user' %}{% set ns.on = false %}{% set ns.last = messages|length - 1 - loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}{% if loop.index0 > ns.last %}>{% endif %}{{ m.content }}{% endfor %}`, true},
	{"loop scope set", `{% for m in messages %}{% if m.role == 'user' %}{% set last_user = m.content %}{% endif %}{{ last_user }}:{{ m.content }};{% endfor %}`, true},
	{"set block", `{% for m in messages %}{% set body %}{{ m.role|upper }}={{ m.content }}{% endset %}{{ body }}{{ prev }}{% set prev = body|length %}{% endfor %}`, true},
	{"nested loop", `{% for m in messages %}{% for c in m.parts %}{{ loop.index }}{{ c }}{% if not loop.last %},{% endif %}{% endfor %}.{% endfor %}`, true},
	{"break", `{% for m in messages %}{% if m.content == 'stop' %}{% break %}{% endif %}{{ m.content }}{% endfor %}`, true},
	{"continue", `{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}`, true},
	{"macro", `{% macro show(m) %}{{ m.role }}:{{ m.content }}{% endmacro %}{% for m in messages %}{{ show(m) }}{% endfor %}`, false},
	{"namespace per message", `{% for m in messages %}{% set f = namespace(found=false) %}{% for x in messages[loop.index:] %}{% if x.role == 'user' %}{% set f.found = true %}{% endif %}{% endfor %}{{ f.found }}{% endfor %}`, false},
	{"cycle", `{% for m in messages %}{{ loop.cycle('a', 'b') }}{{ m.content }}{% endfor %}`, false},
	{"clock", `{% for m in messages %}{{ strftime_now('%S') }}{{ m.content }}{% endfor %}`, false},
	{"string methods", `{% for m in messages %}{% if m.content.startswith('a') %}{{ m.content.split(' ')[0] }}{% endif %}{{ m.content.replace('a', 'A') }}{% endfor %}`, true},
	{"outside value", `{% for m in messages %}{{ greeting if loop.first }}{{ m.content }}{% if flag %}!{% endif %}{% endfor %}`, true},
	{"filter if", `{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.content }}{% endfor %}`, true},
	{"two loops", `{% for m in messages %}{{ m.role }}{% endfor %}|{% for m in messages %}{{ m.content }}{% endfor %}`, true},
	{"call block", `{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% for m in messages %}{% call wrap() %}{{ m.content }}{% endcall %}{% endfor %}`, false},
	{"globals and checks", `{% for m in messages %}{{ chk(m).role }}{{ chk(chk(m).parts)[0] }}{{ glob }}{% if chk(loop).index0 > 2 %}+{% endif %}{% endfor %}`, true},
	{"check of a moving value", `{% for m in messages %}{{ chk(messages)[loop.index0 + 1].role }}{{ m.content }}{% endfor %}`, true},
	{"set a global's name", `{% for m in messages %}{% if m.role == 'user' %}{% set glob = m.content %}{% endif %}{{ glob }}{% endfor %}`, true},
	{"item variable set", `{% for m in messages %}{% if m.role == 'tool' %}{% set m = messages[0] %}{% endif %}{{ m.role }}{{ m.content }}{% endfor %}`, true},
	{"a nested loop kept", `{% set ns = namespace(l=none) %}{% for m in messages %}{% if ns.l %}{{ ns.l.index }}{% endif %}{% for p in m.parts %}{% set ns.l = loop %}{% endfor %}{{ m.content }}{% endfor %}`, true},
	{"a nested loop in a list", `{% set ns = namespace(l=[]) %}{% for m in messages %}{% if ns.l %}{{ ns.l[0].index }}{% endif %}{% for p in m.parts %}{% set ns.l = [loop] %}{% endfor %}{{ m.content }}{% endfor %}`, true},
	{"a memoized loop inside an unrecorded iteration", `{% for m in messages + [1] %}{% if m is mapping %}{{ m.content }};{% else %}{% for p in messages %}<{{ p.role }}>{% endfor %}{% endif %}{% endfor %}`, true},
	{"silent loop", `{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.content %}{% endif %}{% endfor %}{{ ns.n }}:{{ ns.last }}`, false},
	{"an outer name set between two loops", `{% set tag = 'a' %}{% for m in messages %}{% if tag == 'a' %}{{ m.content }}{% endif %}{% endfor %}{% set tag = 'b' %}{% for m in messages %}{% if tag == 'a' %}{{ m.content }}{% else %}-{% endif %}{% endfor %}`, true},
	{"written then read", `{% set ns = namespace(last='') %}{% for m in messages %}{% set prev = ns.last %}{% set ns.last = m.content %}{{ prev }}>{{ ns.last }}{% endfor %}`, true},
}

// memoGlobals are the globals the templates are compiled with: a check (NewCheck) and a string.
var memoGlobals = map[string]Value{
	"chk": NewCheck("chk", func(v Value) error {
		if v.IsUndefined() {
			return fmt.Errorf("undefined")
		}
		return nil
	}),
	"glob": NewString("G"),
}

// memoConversation is n messages: a system prompt, then users and assistants in turn, with
// content drawn by r (sometimes 'stop'), each with parts.
func memoConversation(r *rand.Rand, n int) []Value {
	words := []string{"a b", "abc", " padded ", "stop", "x y z", "", "ab cd"}
	msgs := make([]Value, n)
	for i := range msgs {
		role := [...]string{"user", "assistant"}[i%2]
		if i == 0 {
			role = "system"
		} else if r.IntN(5) == 0 {
			role = "tool"
		}
		d := NewDict()
		d.AsDict().Set("role", NewString(role))
		d.AsDict().Set("content", NewString(words[r.IntN(len(words))]))
		d.AsDict().Set("parts", NewList([]Value{NewString(fmt.Sprint(i)), NewString(words[r.IntN(len(words))])}))
		msgs[i] = d
	}
	return msgs
}

// TestMemo renders every template over the turns of random conversations (each turn the
// messages so far, sharing the earlier turns' dicts, sometimes with one earlier message
// replaced, sometimes with an earlier message's dict sent again) with a memo and without: every turn must be equal, and the memo must replay where the
// template allows and never where it does not.
func TestMemo(t *testing.T) {
	for _, tc := range memoTemplates {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := CompileWith(tc.src, memoGlobals)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			memo := &mapMemo{}
			var stats, unrepeated MemoStats // unrepeated: of the conversations that sent no message twice
			for conv := range 20 {
				msgs := memoConversation(r, 2+r.IntN(12))
				prev := ""
				var cs MemoStats
				repeated := false
				for k := 1; k <= len(msgs); k++ {
					if k > 2 && r.IntN(6) == 0 { // an edited history: a new dict where an old one was
						i := 1 + r.IntN(k-1)
						d := NewDict()
						d.AsDict().Set("role", msgs[i].AsDict().Data["role"])
						d.AsDict().Set("content", NewString("edited"))
						d.AsDict().Set("parts", NewList(nil))
						msgs[i] = d
					}
					if k > 3 && r.IntN(7) == 0 { // a message sent again: one dict twice in a loop, at another place
						msgs[k-1], repeated = msgs[1+r.IntN(k-2)], true
					}
					data := func() map[string]Value {
						return map[string]Value{
							"messages": NewList(append([]Value(nil), msgs[:k]...)), "bos": NewString("<s>"),
							"greeting": NewString("hi"), "flag": NewBool(k/5%2 == 0),
							"strftime_now": NewCallable("strftime_now", func([]Value, map[string]Value) (Value, error) {
								return NewString(fmt.Sprint(k)), nil
							}),
						}
					}
					want, err := tmpl.RenderValues(data())
					if err != nil {
						t.Fatal(err)
					}
					// Expected to begin with the turn before's text (in pieces; sometimes with a
					// byte changed, or none), as a conversation's next turn is.
					expect := expectedPieces(r, prev)
					var spans []Span
					matched, rest, err := tmpl.RenderAfter(data(), RenderOptions{Memo: memo, SizeHint: len(want), Stats: &cs, Spans: &spans}, expect)
					if err != nil {
						t.Fatal(err)
					}
					checkSpans(t, memo, rest, spans)
					joined := strings.Join(expect, "")
					if got := joined[:matched] + rest; got != want {
						t.Fatalf("conversation %d, turn %d: memoized render differs from the plain one\n got %q\nwant %q", conv, k, got, want)
					}
					if n := prefixLen(joined, want); matched != n {
						t.Fatalf("conversation %d, turn %d: %d bytes matched of %q, want %d", conv, k, matched, joined, n)
					}
					prev = want
				}
				stats.Replayed, stats.Kept, stats.NotKept = stats.Replayed+cs.Replayed, stats.Kept+cs.Kept, stats.NotKept+cs.NotKept
				if !repeated {
					unrepeated.Replayed += cs.Replayed
				}
			}
			t.Logf("%+v", stats)
			for loop := range memo.asked {
				if loop.silent {
					t.Errorf("the memo was asked for the iterations of a loop that outputs nothing")
				}
			}
			if stats.Kept != memo.kept {
				t.Errorf("%d iterations counted kept, the memo was given %d", stats.Kept, memo.kept)
			}
			if tc.replayed && stats.Replayed < stats.Kept/2 {
				t.Errorf("%+v: fewer iterations replayed than half of those run", stats)
			}
			if !tc.replayed && unrepeated.Replayed != 0 { // a message sent twice may replay where its iteration reads come out the same
				t.Errorf("%+v: a template whose iterations must not be replayed had %d replayed", stats, unrepeated.Replayed)
			}
		})
	}
}

// expectedPieces is text cut at up to three places drawn by r (empty pieces too), one time in five
// with a byte changed, one time in eight none.
func expectedPieces(r *rand.Rand, text string) []string {
	if r.IntN(8) == 0 {
		return nil
	}
	if text != "" && r.IntN(5) == 0 {
		b := []byte(text)
		b[r.IntN(len(b))] ^= 1
		text = string(b)
	}
	cuts := []int{0, len(text)}
	for range r.IntN(4) {
		cuts = append(cuts, r.IntN(len(text)+1))
	}
	slices.Sort(cuts)
	var pieces []string
	for i := 1; i < len(cuts); i++ {
		pieces = append(pieces, text[cuts[i-1]:cuts[i]])
	}
	return pieces
}

// prefixLen is the length of the longest common prefix of a and b.
func prefixLen(a, b string) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

// TestLoopAttributes: the loop object's attributes, computed when read, are Jinja2's at each
// iteration, inside a nested loop too, and a loop object kept past its loop keeps its last place.
func TestLoopAttributes(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}`,
			"1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
		{`{% for x in items %}{{ loop.previtem is defined }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}`,
			"Falseba;Trueacb;Trueba;"},
		{`{% for x in items %}{% for y in items[:2] %}{{ loop.index }}{% endfor %}{{ loop.index }}{{ ' ' }}{% endfor %}`, "121 122 123 "},
		{`{% set ns = namespace() %}{% for x in items %}{% set ns.l = loop %}{% endfor %}{{ ns.l.index }}{{ ns.l.last }}{{ ns.l['index0'] }}{{ 'index' in ns.l }}{{ ns.l['revindex'] }}`, "3True2True1"},
		{`{% for x in items %}{{ loop.keys()|list }}{% endfor %}`, "['length']['length']['length']"},
	} {
		tmpl, err := Compile(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(map[string]any{"items": []any{"a", "b", "c"}})
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s\n got %q\nwant %q", tc.src, got, tc.want)
		}
	}
}

// TestMemoSizeOfReads: an iteration that reads a large list whole (the messages, in a condition,
// as Qwen3's scan does) holds it by a weak pointer: its size does not count the list, and the
// iterations' sizes together stay linear in the conversation, not quadratic.
func TestMemoSizeOfReads(t *testing.T) {
	tmpl, err := Compile(`{% for m in messages %}{% if messages|length > loop.index0 %}{{ m.content }}{% endif %}{% set w = m.content.split(' ') %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	msgs := make([]Value, n)
	for i := range msgs {
		d := NewDict()
		d.AsDict().Set("content", NewString(fmt.Sprintf("message %d of many words", i)))
		msgs[i] = d
	}
	memo := &mapMemo{}
	if _, err := tmpl.RenderWith(map[string]Value{"messages": NewList(msgs)}, RenderOptions{Memo: memo}); err != nil {
		t.Fatal(err)
	}
	if len(memo.m) != n {
		t.Fatalf("%d iterations kept, want %d", len(memo.m), n)
	}
	for key, it := range memo.m {
		// The item, the split list it made, the output and the events: well under a KiB; the
		// messages list alone would be 24 B × 500.
		if size := it.Size(1 << 20); size > 1024 {
			t.Fatalf("iteration over %q: %d bytes", key.Item.Data["content"].AsString(), size)
		}
	}
}

// TestMemoConstantShadowed: a read of a constant (a global, a builtin) is not recorded, so an
// iteration that read one is replayed only where the name is still the constant: not where a set
// of the loop has shadowed it by then (a message sent again, later in the loop), nor in a render
// whose data shadows it. Each turn renders with the memo and without; they must be equal.
func TestMemoConstantShadowed(t *testing.T) {
	msg := func(role, content string) Value {
		d := NewDict()
		d.AsDict().Set("role", NewString(role))
		d.AsDict().Set("content", NewString(content))
		return d
	}
	sys, user, answer := msg("system", "s"), msg("user", "U"), msg("assistant", "A")
	tests := map[string]struct {
		src   string
		turns [][]Value
		data  []map[string]Value // each turn's data besides messages
	}{
		"a set shadows a global for the iterations after it": {
			src:   `{% for m in messages %}{% if m.role == 'user' %}{% set glob = m.content %}{% endif %}{{ glob }}{% endfor %}`,
			turns: [][]Value{{sys, answer, user}, {sys, answer, user, answer}, {sys, answer, user, answer, user}},
		},
		"a set shadows a builtin": {
			src:   `{% for m in messages %}{% if m.role == 'user' %}{% set range = m.content %}{% endif %}{{ range is string }}{% endfor %}`,
			turns: [][]Value{{sys, answer, user}, {sys, answer, user, answer}},
		},
		"the data shadows a global in one render": {
			src:   `{% for m in messages %}{{ glob }}{{ m.content }}{% endfor %}`,
			turns: [][]Value{{sys, user}, {sys, user, answer}, {sys, user, answer}, {sys, user, answer, user}},
			data:  []map[string]Value{nil, {"glob": NewString("D")}, nil, nil},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tmpl, err := CompileWith(tc.src, memoGlobals)
			if err != nil {
				t.Fatal(err)
			}
			memo := &mapMemo{}
			var stats MemoStats
			for k, msgs := range tc.turns {
				data := func() map[string]Value {
					d := map[string]Value{"messages": NewList(append([]Value(nil), msgs...))}
					if k < len(tc.data) {
						maps.Copy(d, tc.data[k])
					}
					return d
				}
				want, err := tmpl.RenderValues(data())
				if err != nil {
					t.Fatal(err)
				}
				if _, got, err := tmpl.RenderAfter(data(), RenderOptions{Memo: memo, Stats: &stats}, nil); err != nil || got != want {
					t.Fatalf("turn %d: %q (%v) with the memo, %q without", k, got, err, want)
				}
			}
			if stats.Replayed == 0 {
				t.Errorf("%+v: nothing replayed", stats)
			}
		})
	}
}

// TestSilentLoops checks which loops a template's compilation finds cannot output (their
// iterations are run, never memoized): the loops of each source, in source order.
func TestSilentLoops(t *testing.T) {
	for _, tc := range []struct {
		src    string
		silent []bool
	}{
		{`{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}`, []bool{true}},
		{`{% for m in messages %}x{% endfor %}`, []bool{false}},
		{`{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}`, []bool{false}},
		{`{% for m in messages %}{% if m.role == 'user' %}{% else %}{{ m.role }}{% endif %}{% endfor %}`, []bool{false}},
		{`{% for m in messages %}{% set body %}{{ m.content }}{% endset %}{% set ns.b = body %}{% endfor %}`, []bool{true}},
		{`{% for m in messages %}{% for p in m.parts %}{{ p }}{% endfor %}{% endfor %}`, []bool{false, false}},
		{`{% for m in messages %}{% for p in m.parts %}{% set ns.p = p %}{% endfor %}{% endfor %}`, []bool{true, true}},
		{`{% for m in messages %}{% for p in m.parts %}{% else %}none{% endfor %}{% endfor %}`, []bool{false, true}},
		{`{% for m in messages %}{% macro f() %}x{% endmacro %}{% endfor %}`, []bool{true}},
		{`{% macro f(ms) %}{% for m in ms %}{{ m }}{% endfor %}{% endmacro %}{{ f(messages) }}`, []bool{false}},
		{`{% for m in messages %}{% filter upper %}{% for p in m.parts %}{% set ns.p = p %}{% endfor %}{% endfilter %}{% endfor %}`, []bool{false, true}},
		{`{% macro f() %}{{ caller() }}{% endmacro %}{% for m in messages %}{% call f() %}{% endcall %}{% endfor %}`, []bool{false}},
	} {
		tmpl, err := Compile(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		var silent []bool
		for _, l := range loopsOf(tmpl.nodes) {
			silent = append(silent, l.silent)
		}
		if !slices.Equal(silent, tc.silent) {
			t.Errorf("%s: silent loops %v, want %v", tc.src, silent, tc.silent)
		}
	}
}

// loopsOf are the loops among nodes, at any depth, in source order.
func loopsOf(nodes []node) []*forNode {
	var out []*forNode
	for _, n := range nodes {
		switch n := n.(type) {
		case *forNode:
			out = append(out, n)
			out = append(out, loopsOf(n.body)...)
			out = append(out, loopsOf(n.elseBody)...)
		case *ifNode:
			for _, b := range n.branches {
				out = append(out, loopsOf(b.body)...)
			}
		case *setBlockNode:
			out = append(out, loopsOf(n.body)...)
		case *macroNode:
			out = append(out, loopsOf(n.body)...)
		case *callNode:
			out = append(out, loopsOf(n.body)...)
		case *filterBlockNode:
			out = append(out, loopsOf(n.body)...)
		}
	}
	return out
}
