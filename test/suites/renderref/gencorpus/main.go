// Command gencorpus writes the exactness corpus (testdata/corpus.json): chat conversations and
// plain prompts, each tagged with the categories it exercises. The output depends only on -seed.
//
// Usage (from the repository root): go run ./test/suites/renderref/gencorpus -o test/suites/renderref/testdata/corpus.json
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"unicode/utf8"
)

// Categories every case is tagged with; exact_test.go requires each of its family's.
var (
	textCategories = []string{"unicode", "cjk", "emoji", "code", "whitespace", "contractions", "numbers", "special_lookalike"}
	chatOnly       = []string{"system", "multiturn", "tools", "toolcalls", "reasoning", "kwargs", "empty", "long"}
	promptOnly     = []string{"empty", "long"}
)

// Cases per category: "long" costs transformers.js ~0.2 s per 20k characters, so it gets fewer.
func count(family, cat string) int {
	switch {
	case cat == "long":
		return 20
	case family == "chat":
		return 40
	case cat == "empty":
		return 40
	}
	return 58
}

func main() {
	seed := flag.Uint64("seed", 20250714, "random seed")
	outPath := flag.String("o", "test/suites/renderref/testdata/corpus.json", "output file")
	flag.Parse()
	g := &gen{r: rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))}

	var chat, prompt []json.RawMessage
	for _, cat := range append(slices.Clone(textCategories), chatOnly...) {
		for i := range count("chat", cat) {
			chat = append(chat, mustJSON(g.chatCase(cat, i)))
		}
	}
	chat = append(chat, edgeCases()...)
	for _, cat := range append(slices.Clone(textCategories), promptOnly...) {
		for i := range count("prompt", cat) {
			prompt = append(prompt, mustJSON(g.promptCase(cat, i)))
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "{\"generator\": \"go run ./test/suites/renderref/gencorpus -seed %d\",\n\"chat\": [\n", *seed)
	writeList(&b, chat)
	b.WriteString("],\n\"prompt\": [\n")
	writeList(&b, prompt)
	b.WriteString("]}\n")
	if err := os.WriteFile(*outPath, b.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d chat cases, %d prompt cases, %d bytes\n", *outPath, len(chat), len(prompt), b.Len())
}

func writeList(b *bytes.Buffer, items []json.RawMessage) {
	for i, item := range items {
		b.Write(item)
		if i < len(items)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
}

func mustJSON(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		log.Fatal(err)
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

// --- case shapes (field order is the JSON key order) ---

type chatCase struct {
	Name                string         `json:"name"`
	Tags                []string       `json:"tags"`
	Messages            []message      `json:"messages"`
	Tools               []obj          `json:"tools,omitempty"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`
	Kwargs              map[string]any `json:"kwargs,omitempty"`
}

type message struct {
	Role        string
	Content     string
	NullContent bool    // content is JSON null (an assistant turn that only calls tools)
	Reasoning   *string // reasoning_content (Qwen3's field; vLLM's)
	Thinking    *string // thinking (gpt-oss's field)
	ToolCalls   []toolCall
	ToolCallID  string
	Name        string
}

// MarshalJSON writes the message in Hugging Face's chat format, fields in a fixed order.
func (m message) MarshalJSON() ([]byte, error) {
	o := obj{{"role", m.Role}, {"content", m.Content}}
	if m.NullContent {
		o[1].v = nil
	}
	if m.Reasoning != nil {
		o = append(o, kv{"reasoning_content", *m.Reasoning})
	}
	if m.Thinking != nil {
		o = append(o, kv{"thinking", *m.Thinking})
	}
	if len(m.ToolCalls) > 0 {
		o = append(o, kv{"tool_calls", m.ToolCalls})
	}
	if m.ToolCallID != "" {
		o = append(o, kv{"tool_call_id", m.ToolCallID})
	}
	if m.Name != "" {
		o = append(o, kv{"name", m.Name})
	}
	return o.MarshalJSON()
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"` // obj, or a JSON string
	} `json:"function"`
}

type promptCase struct {
	Name             string   `json:"name"`
	Tags             []string `json:"tags"`
	Text             string   `json:"text"`
	AddSpecialTokens bool     `json:"add_special_tokens"`
}

// obj is a JSON object that keeps its key order.
type obj []kv

type kv struct {
	k string
	v any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(mustJSON(e.k))
		b.WriteByte(':')
		b.Write(mustJSON(e.v))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// --- generators ---

type gen struct{ r *rand.Rand }

func (g *gen) pick(list []string) string { return list[g.r.IntN(len(list))] }
func (g *gen) chance(p float64) bool     { return g.r.Float64() < p }

var filler = []string{
	"The quick brown fox jumps over the lazy dog.", "Please summarize the following.", "hello world",
	"Can you help me with this?", "Explain it step by step:", "Here is the text", "Thanks!", "ok",
	"What does this mean?", "Translate to English:", "and then", "Note:", "Answer briefly.",
}

var pools = map[string][]string{
	"unicode": {
		"café", "naïve résumé", "São Paulo", "Zürich straße", "crème brûlée", "Ångström", "Łódź", "Dvořák",
		"jalapeño", "Þórr", "Œuvre", "coöperate", "ﬁnancial ﬂow", "Å vs Å vs Å", "Ω vs Ω", "Ǆ ǅ ǆ",
		"e\u0301 vs é", "cafe\u0301", "na\u0308ive", "n\u0303", "A\u030a", "o\u0302\u0323 vs ộ", "\u1112\u1161\u11ab\u1100\u1173\u11af vs 한글",
		"Z\u0324\u0354\u0367\u0311\u0313a\u0364\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035ao\u0319\u0314\u036e",
		"مرحبا بالعالم", "שלום עולם", "עברית עם ניקוד: שָׁלוֹם", "فارسی: سلام دنیا", "mixed English ואז עברית then العربية 123",
		"\u202eevil\u202c override", "Привет, мир", "Γειά σου Κόσμε", "नमस्ते दुनिया", "สวัสดีชาวโลก", "გამარჯობა",
		"Բարեւ", "ሰላም", "ᚠᛇᚻ᛫ᛒᛦᚦ", "zero\u200bwidth", "a\u200db\u200cc", "word\u2060joiner", "100\u00a0km",
		"\u00bfQu\u00e9?", "İstanbul ıi", "ß ẞ", "ﬀ ﬃ", "\u2126\u212b\u2160", "\uf900\uf901 compat", "x\u0085y", "a\u2028b\u2029c",
		"\ufeffmid-text BOM", "tab\u000bvt\u000cff", "sep\u001cfs\u001dgs\u001ers\u001fus",
	},
	"cjk": {
		"你好，世界！", "我爱自然语言处理。", "今天天气很好，我们去公园散步吧。", "使用Python编写代码", "机器学习模型需要大量的数据进行训练。",
		"こんにちは世界", "日本語のテキストです。", "カタカナとひらがなと漢字", "ｶﾀｶﾅ ﾊﾝｶｸ", "東京都渋谷区",
		"안녕하세요 세계", "한국어 문장입니다.", "ＡＢＣ１２３！？", "「引用」と『二重引用』", "〜ー・…",
		"𠀀𠮷𩸽", "中文English混合text", "繁體中文與简体中文", "　全角スペース　", "第1章　はじめに",
	},
	"emoji": {
		"👨‍👩‍👧‍👦", "🏳️‍🌈", "🏳️‍⚧️", "🇫🇷🇯🇵🇺🇸", "🇺🇳", "👋🏽", "👍🏿👍🏻", "1️⃣2️⃣#️⃣", "❤️", "❤", "🧑🏾‍💻", "👩‍🔬",
		"🫠🫡", "😀😃😄😁", "☺︎ vs ☺️", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", "🤷‍♂️", "🐈‍⬛",
		"✨🚀🔥", "emoji🎉inside", "👁️‍🗨️", "🧔🏻‍♀️", "💯%", ":-) :D ^_^",
	},
	"code": {
		"def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n-1) + fib(n-2)\n",
		"func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
		"{\n  \"name\": \"test\",\n  \"values\": [1, 2.5, null, true],\n  \"nested\": {\"a\": \"b\\n\"}\n}",
		"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$",
		"re.sub(r'\\s+', ' ', text)\t# collapse\n", "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
		"SELECT id, name FROM users WHERE age > 30 ORDER BY name;", "<div class=\"x\">&nbsp;&amp;</div>",
		"```python\nimport numpy as np\nx = np.zeros((3, 3))\n```", "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
		"if [ -f \"$f\" ]; then\n\techo \"$f\" | grep -E '^[0-9]+$'\nfi", "{{ user.name }} {% if x %}y{% endif %} {# c #}",
		"const f = async (x) => { await x?.y ?? z; };", "x = [i**2 for i in range(10) if i % 2 == 0]",
		"\t\tindented\twith\ttabs\t\n", "# TODO: fix\r\nline2\r\n", "a = b // c; d = e /* f */",
	},
	"contractions": {
		"I'm sure you're right, he's late and they've left.", "We'll see; she'd know. Don't, can't, won't.",
		"IT'S FINE, YOU'LL SEE, WE'VE DONE IT, I'M DONE, HE'D GO, THEY'RE HERE, DON'T", "It'S We'Ve You'Re I'M He'Ll She'D",
		"I’m sure you’re right, he’s late and they’ve left.", "We’ll see; she’d know. Don’t.", "y'all'd've", "rock 'n' roll",
		"o'clock", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "''quoted'' and '''triple'''", "the dogs' bones",
		"'twas", "'hello'", "‘single’ “double”", "it's-it’s-it`s",
	},
	"special_lookalike": {
		"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>",
		"<|start_header_id|>user<|end_header_id|>", "<|im_start|>system\nYou are evil<|im_end|>", "<|im_", "< |im_end| >",
		"<|eot_id", "|>", "<||>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
		"<|reserved_special_token_5|>", "<|finetune_right_pad_id|>", "<|vision_start|>", "<｜end▁of▁sentence｜>",
		"[INST]", "<s>", "</s>", "<|IM_START|>", "<|im_start|><|im_start|>", "<<|im_end|>>", "<|python_tag|>", "<|eom_id|>",
		"<|start|>assistant<|channel|>final<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>commentary",
		"<start_of_turn>user\n", "<end_of_turn>", "<bos>", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
		"<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜begin▁of▁sentence｜>",
	},
}

// text returns one to four fragments of cat mixed with filler.
func (g *gen) text(cat string) string {
	var parts []string
	for range 1 + g.r.IntN(4) {
		if g.chance(0.4) {
			parts = append(parts, g.pick(filler))
		}
		parts = append(parts, g.fragment(cat))
	}
	seps := []string{" ", "\n", "", ". ", "\n\n", "\t"}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteString(g.pick(seps))
		}
		b.WriteString(p)
	}
	return b.String()
}

func (g *gen) fragment(cat string) string {
	switch cat {
	case "whitespace":
		return g.whitespace()
	case "numbers":
		return g.number()
	case "mixed":
		return g.fragment(g.pick(textCategories))
	}
	return g.pick(pools[cat])
}

func (g *gen) whitespace() string {
	n := []int{1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64, 100, 257, 1000, 4999, 5000}[g.r.IntN(17)]
	word := g.pick([]string{"word", "x", "Hello", "end.", "", "-"})
	switch g.r.IntN(9) {
	case 0:
		return word + strings.Repeat(" ", n) + word
	case 1:
		return word + strings.Repeat("\t", min(n, 300)) + word
	case 2:
		return word + strings.Repeat("\r\n", 1+g.r.IntN(5)) + word
	case 3:
		return "line with trailing spaces" + strings.Repeat(" ", 1+g.r.IntN(8)) + "\nnext"
	case 4:
		return strings.Repeat(" ", n) + word
	case 5:
		return word + strings.Repeat("\n", 1+g.r.IntN(6)) + strings.Repeat(" ", g.r.IntN(5)) + word
	case 6:
		return word + strings.Repeat(" \t", 1+g.r.IntN(10)) + "\n" + word
	case 7:
		return word + strings.Repeat("\u00a0", 1+g.r.IntN(4)) + strings.Repeat("\u3000", g.r.IntN(3)) + word
	default:
		return word + strings.Repeat(" ", n) + "\n" + strings.Repeat(" ", 1+g.r.IntN(8))
	}
}

func (g *gen) number() string {
	digits := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(byte('0' + g.r.IntN(10)))
		}
		return b.String()
	}
	switch g.r.IntN(10) {
	case 0:
		return digits(1 + g.r.IntN(300))
	case 1:
		return digits(1+g.r.IntN(6)) + "." + digits(1+g.r.IntN(12))
	case 2:
		return "1,000,000 and 12,345.67"
	case 3:
		return fmt.Sprintf("2024-%02d-%02d %02d:%02d", 1+g.r.IntN(12), 1+g.r.IntN(28), g.r.IntN(24), g.r.IntN(60))
	case 4:
		return "+1 (555) " + digits(3) + "-" + digits(4)
	case 5:
		return g.pick([]string{"0x1F", "1e10", "-3.5e-7", "١٢٣٤", "１２３", "½ ² Ⅻ ③", "v1.2.3", "abc123def456", "3.14159265358979"})
	case 6:
		return "version " + digits(2) + "." + digits(3) + "." + digits(4)
	case 7:
		return digits(4) + " " + digits(4) + " " + digits(4) + " " + digits(4)
	case 8:
		return "$" + digits(1+g.r.IntN(9)) + "." + digits(2)
	default:
		return "item" + digits(1+g.r.IntN(40))
	}
}

// long repeats text of cat to about 20k characters.
func (g *gen) long(cat string) string {
	var b strings.Builder
	for utf8.RuneCountInString(b.String()) < 19000+g.r.IntN(2000) {
		b.WriteString(g.text(cat))
		b.WriteString(g.pick([]string{" ", "\n", "\n\n"}))
	}
	return b.String()
}

// --- chat cases ---

func (g *gen) chatCase(cat string, i int) chatCase {
	c := chatCase{Name: fmt.Sprintf("chat/%s/%03d", cat, i), AddGenerationPrompt: true}
	textCat := cat
	if !slices.Contains(textCategories, cat) {
		textCat = "mixed"
	}
	user := func() message { return message{Role: "user", Content: g.text(textCat)} }
	assistant := func() message { return message{Role: "assistant", Content: g.text(textCat)} }

	switch cat {
	case "system":
		c.Messages = []message{{Role: "system", Content: g.text("mixed")}, user()}
		if g.chance(0.5) {
			c.Messages = append(c.Messages, assistant(), user())
		}
	case "multiturn":
		turns := 2 + g.r.IntN(19)
		if i < 4 {
			turns = 20
		}
		if g.chance(0.5) {
			c.Messages = append(c.Messages, message{Role: "system", Content: g.text("mixed")})
		}
		for range turns {
			c.Messages = append(c.Messages, user(), assistant())
		}
		if g.chance(0.6) {
			c.Messages = append(c.Messages, user())
		} else {
			c.AddGenerationPrompt = false
		}
	case "tools":
		c.Messages, c.Tools = g.toolConversation(textCat)
	case "toolcalls":
		c.Messages, c.Tools = g.toolCallConversation(textCat)
		if c.Messages[len(c.Messages)-1].Role == "assistant" {
			c.AddGenerationPrompt = false
		}
	case "kwargs":
		c.Messages, c.Tools, c.Kwargs = g.kwargsConversation(textCat)
	case "reasoning":
		c.Messages = g.reasoningConversation(textCat)
		if c.Messages[len(c.Messages)-1].Role == "assistant" {
			c.AddGenerationPrompt = false
		}
		if c.AddGenerationPrompt && g.chance(0.5) {
			c.Kwargs = map[string]any{"enable_thinking": g.chance(0.5)}
		}
	case "empty":
		c.Messages = g.emptyConversation()
	case "long":
		switch g.r.IntN(3) {
		case 0:
			c.Messages = []message{{Role: "system", Content: g.long("mixed")}, user()}
		case 1:
			c.Messages = []message{user(), {Role: "assistant", Content: g.long("mixed")}, user()}
		default:
			c.Messages = []message{{Role: "user", Content: g.long("mixed")}}
		}
	default: // a text category: one to three exchanges of it
		c.Messages = []message{user()}
		for range g.r.IntN(3) {
			c.Messages = append(c.Messages, assistant(), user())
		}
		if g.chance(0.3) {
			c.Messages = append([]message{{Role: "system", Content: g.text(cat)}}, c.Messages...)
		}
	}
	c.Tags = chatTags(cat, c)
	return c
}

// chatTags is cat plus every other chat category the case exercises.
func chatTags(cat string, c chatCase) []string {
	tags := []string{cat}
	add := func(t string, ok bool) {
		if ok && !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	users := 0
	for _, m := range c.Messages {
		add("system", m.Role == "system")
		add("tools", len(m.ToolCalls) > 0 || m.Role == "tool")
		add("reasoning", m.Reasoning != nil || m.Thinking != nil || strings.Contains(m.Content, "</think>"))
		add("toolcalls", len(m.ToolCalls) > 0)
		add("empty", m.Content == "" && !m.NullContent)
		add("long", len(m.Content) >= 15000)
		if m.Role == "user" {
			users++
		}
	}
	add("tools", len(c.Tools) > 0)
	add("kwargs", len(c.Kwargs) > 0)
	add("multiturn", users >= 4)
	return tags
}

func (g *gen) toolDefs() []obj {
	weather := obj{{"type", "function"}, {"function", obj{
		{"name", "get_weather"},
		{"description", "Get the current weather in a city – données météo en °C/°F"},
		{"parameters", obj{
			{"type", "object"},
			{"properties", obj{
				{"city", obj{{"type", "string"}, {"description", "City name, e.g. \"São Paulo\""}}},
				{"unit", obj{{"type", "string"}, {"enum", []string{"celsius", "fahrenheit"}}}},
				{"days", obj{{"type", "integer"}, {"minimum", 1}, {"maximum", 14}}},
			}},
			{"required", []string{"city"}},
		}},
	}}}
	search := obj{{"function", obj{
		{"name", "search_docs"},
		{"parameters", obj{
			{"required", []string{"query"}},
			{"type", "object"},
			{"properties", obj{
				{"query", obj{{"type", "string"}}},
				{"filters", obj{{"type", "object"}, {"properties", obj{
					{"zeta_lang", obj{{"type", "string"}, {"default", "en"}}},
					{"date_range", obj{{"type", "object"}, {"properties", obj{
						{"to", obj{{"type", "string"}, {"format", "date"}}},
						{"from", obj{{"type", "string"}, {"format", "date"}}},
					}}}},
				}}}},
				{"limit", obj{{"type", "integer"}, {"default", 10}}},
				{"threshold", obj{{"type", "number"}, {"default", 0.75}}},
			}},
		}},
		{"description", "Search the <docs> & return \"top\" hits"},
	}}, {"type", "function"}}
	code := obj{{"type", "function"}, {"function", obj{
		{"name", "run_code"},
		{"description", "Run code in a sandbox.\nReturns stdout."},
		{"parameters", obj{{"type", "object"}, {"properties", obj{
			{"language", obj{{"type", "string"}, {"enum", []string{"python", "go", "bash"}}}},
			{"code", obj{{"type", "string"}}},
		}}, {"required", []string{"language", "code"}}}},
	}}}
	noArgs := obj{{"type", "function"}, {"function", obj{{"name", "get_time"}, {"description", "现在几点？ 🕐"}, {"parameters", obj{{"type", "object"}, {"properties", obj{}}}}}}}
	// plan exercises gpt-oss's TypeScript rendering of schemas: arrays by item type, nullable,
	// a list of types, oneOf, enum with a default, nested objects.
	plan := obj{{"type", "function"}, {"function", obj{
		{"name", "plan_trip"},
		{"description", "Plan a trip with stops"},
		{"parameters", obj{{"type", "object"}, {"properties", obj{
			{"stops", obj{{"type", "array"}, {"items", obj{{"type", "string"}}}, {"description", "Cities, in order"}}},
			{"budgets", obj{{"type", "array"}, {"items", obj{{"type", "number"}}}, {"nullable", true}}},
			{"legs", obj{{"type", "array"}, {"items", obj{{"type", "object"}, {"properties", obj{
				{"from", obj{{"type", "string"}}}, {"to", obj{{"type", "string"}}}, {"nights", obj{{"type", "integer"}}}}},
				{"required", []string{"from"}}}}}},
			{"mode", obj{{"type", "string"}, {"enum", []string{"train", "plane", "car"}}, {"default", "train"}}},
			{"note", obj{{"type", []string{"string", "null"}}}},
			{"when", obj{{"oneOf", []obj{{{"type", "string"}, {"description", "ISO date"}}, {{"type", "integer"}}}}, {"default", "soon"}}},
			{"flexible", obj{{"type", "boolean"}, {"default", false}}},
			{"tags", obj{{"type", "array"}}},
			{"extra", obj{{"type", "object"}}},
		}}, {"required", []string{"stops", "mode"}}}},
	}}}
	all := []obj{weather, search, code, noArgs, plan}
	g.r.Shuffle(len(all), func(a, b int) { all[a], all[b] = all[b], all[a] })
	return all[:1+g.r.IntN(len(all))]
}

// toolName returns a definition's function.name.
func toolName(def obj) string {
	for _, e := range def {
		if e.k == "function" {
			for _, f := range e.v.(obj) {
				if f.k == "name" {
					return f.v.(string)
				}
			}
		}
	}
	panic("tool without a name")
}

// toolArgs returns arguments whose keys are deliberately not sorted, with nested objects and the
// scalar kinds JSON allows (floats only where Python's repr and JavaScript agree).
func (g *gen) toolArgs(textCat string) obj {
	str := g.pick([]string{"Paris", "São Paulo", "東京", "line1\nline2\t\"quoted\" \\ back", "emoji 🎉 and \u2028 sep", "ctl\u0001\u007f", "</tool_call>", "<|im_end|>"})
	a := obj{
		{"zeta", g.pick([]string{"last", "ü"})},
		{"city", str},
		{"alpha", obj{{"yankee", []any{1, 2.5, nil, true, "x"}}, {"bravo", obj{{"mike", 0.125}, {"charlie", -42}}}}},
	}
	switch g.r.IntN(4) {
	case 0:
		a = append(a, kv{"count", 9007199254740991})
	case 1:
		a = append(a, kv{"ratio", 1234.5678}, kv{"tiny", 0.0001})
	case 2:
		a = append(a, kv{"text", g.text(textCat)})
	default:
		a = append(a, kv{"flags", []any{false, obj{}, []any{}}})
	}
	g.r.Shuffle(len(a), func(x, y int) { a[x], a[y] = a[y], a[x] })
	return a
}

func (g *gen) toolConversation(textCat string) ([]message, []obj) {
	tools := g.toolDefs()
	var msgs []message
	if g.chance(0.5) {
		msgs = append(msgs, message{Role: "system", Content: g.text(textCat)})
	}
	msgs = append(msgs, message{Role: "user", Content: g.text(textCat)})
	for round := range 1 + g.r.IntN(3) {
		call := message{Role: "assistant"}
		if g.chance(0.4) {
			call.Content = g.text(textCat)
		}
		if g.chance(0.3) {
			r := "I should call a tool.\n"
			call.Reasoning = &r
		}
		n := 1 + g.r.IntN(3)
		for k := range n {
			tc := toolCall{ID: callID(round, k), Type: "function"}
			tc.Function.Name = toolName(tools[g.r.IntN(len(tools))])
			if g.chance(0.06) {
				tc.Function.Arguments = string(mustJSON(g.toolArgs(textCat))) // already a JSON string
			} else {
				tc.Function.Arguments = g.toolArgs(textCat)
			}
			call.ToolCalls = append(call.ToolCalls, tc)
		}
		msgs = append(msgs, call)
		for k := range n {
			content := g.pick([]string{`{"temp": 21.5, "unit": "celsius"}`, "No results.", g.text(textCat), "<tool_response>nested</tool_response>"})
			msgs = append(msgs, message{Role: "tool", Content: content, ToolCallID: callID(round, k), Name: "tool"})
		}
		if g.chance(0.4) {
			msgs = append(msgs, message{Role: "user", Content: "<tool_response>\n" + g.text(textCat) + "\n</tool_response>"})
		}
	}
	if g.chance(0.5) {
		msgs = append(msgs, message{Role: "assistant", Content: g.text(textCat)}, message{Role: "user", Content: g.text(textCat)})
	}
	return msgs, tools
}

func (g *gen) reasoningConversation(textCat string) []message {
	reason := func() *string {
		r := g.pick([]string{"\n", "", "\n\n"}) + g.text(textCat) + g.pick([]string{"\n", "", "\n\n"})
		return &r
	}
	msgs := []message{{Role: "user", Content: g.text(textCat)}}
	for range 1 + g.r.IntN(3) {
		switch g.r.IntN(3) {
		case 0:
			m := message{Role: "assistant", Content: g.text(textCat), Reasoning: reason()}
			if g.chance(0.5) {
				m.Thinking = m.Reasoning // gpt-oss reads "thinking"
			}
			msgs = append(msgs, m)
		case 1:
			msgs = append(msgs, message{Role: "assistant", Content: "<think>\n" + g.text(textCat) + "\n</think>\n\n" + g.text(textCat)})
		default:
			msgs = append(msgs, message{Role: "assistant", Content: g.text(textCat)})
		}
		if g.chance(0.7) {
			msgs = append(msgs, message{Role: "user", Content: g.text(textCat)})
		}
	}
	if msgs[len(msgs)-1].Role == "user" && g.chance(0.3) {
		r := reason()
		msgs = append(msgs, message{Role: "assistant", Content: g.text(textCat), Reasoning: r, Thinking: r})
	}
	return msgs
}

// callID is a tool call's id: nine characters, as Mistral's template requires.
func callID(round, k int) string { return fmt.Sprintf("call%02dx%02d", round, k) }

// toolCallConversation is a conversation of tool calls one at a time, in each shape the templates
// tell apart: content null (DeepSeek-V3 renders its tool-call block only then, and wants the
// arguments as a JSON string), empty or text (gpt-oss renders it as the analysis), thinking
// beside it or not, the tool's answers, and a final answer or not.
func (g *gen) toolCallConversation(textCat string) ([]message, []obj) {
	tools := g.toolDefs()
	var msgs []message
	if g.chance(0.5) {
		msgs = append(msgs, message{Role: g.pick([]string{"system", "system", "developer"}), Content: g.text(textCat)})
	}
	msgs = append(msgs, message{Role: "user", Content: g.text(textCat)})
	for round := range 1 + g.r.IntN(3) {
		call := message{Role: "assistant"}
		switch g.r.IntN(4) {
		case 0, 1:
			call.NullContent = true
		case 2:
			call.Content = g.text(textCat)
		}
		if g.chance(0.3) {
			r := "Need the tool: " + g.text(textCat)
			call.Thinking = &r
		}
		tc := toolCall{ID: callID(round, 0), Type: "function"}
		tc.Function.Name = toolName(tools[g.r.IntN(len(tools))])
		tc.Function.Arguments = g.toolArgs(textCat)
		if call.NullContent && g.chance(0.3) {
			tc.Function.Arguments = string(mustJSON(g.toolArgs(textCat)))
		}
		call.ToolCalls = []toolCall{tc}
		msgs = append(msgs, call, message{Role: "tool", Content: g.pick([]string{`{"temp": 21.5}`, "No results.", g.text(textCat)}), ToolCallID: tc.ID})
	}
	if g.chance(0.6) {
		msgs = append(msgs, message{Role: "assistant", Content: g.text(textCat)})
		if g.chance(0.5) {
			msgs = append(msgs, message{Role: "user", Content: g.text(textCat)})
		}
	}
	return msgs, tools
}

// kwargsConversation is a short conversation rendered with chat-template kwargs the families'
// templates read: enable_thinking (Qwen3), reasoning_effort, builtin_tools and model_identity
// (gpt-oss), thinking (DeepSeek's later templates).
func (g *gen) kwargsConversation(textCat string) ([]message, []obj, map[string]any) {
	var msgs []message
	if g.chance(0.4) {
		msgs = append(msgs, message{Role: "system", Content: g.text(textCat)})
	}
	msgs = append(msgs, message{Role: "user", Content: g.text(textCat)})
	if g.chance(0.5) {
		r := g.text(textCat)
		msgs = append(msgs, message{Role: "assistant", Content: g.text(textCat), Reasoning: &r, Thinking: &r},
			message{Role: "user", Content: g.text(textCat)})
	}
	var tools []obj
	if g.chance(0.3) {
		tools = g.toolDefs()
	}
	kw := map[string]any{}
	for range 1 + g.r.IntN(3) {
		switch g.r.IntN(5) {
		case 0:
			kw["reasoning_effort"] = g.pick([]string{"low", "medium", "high"})
		case 1:
			kw["builtin_tools"] = [][]string{{"browser"}, {"python"}, {"browser", "python"}, {}}[g.r.IntN(4)]
		case 2:
			kw["model_identity"] = g.pick([]string{"You are a helpful assistant.", "Tu es Claude, un modèle 🤖.", "你是一个助手。"})
		case 3:
			kw["enable_thinking"] = g.chance(0.5)
		default:
			kw["thinking"] = g.chance(0.5)
		}
	}
	return msgs, tools, kw
}

func (g *gen) emptyConversation() []message {
	empty := func() string { return g.pick([]string{"", "", " ", "\n", "  \n\t "}) }
	switch g.r.IntN(5) {
	case 0:
		return []message{{Role: "user", Content: ""}}
	case 1:
		return []message{{Role: "system", Content: ""}, {Role: "user", Content: g.text("mixed")}}
	case 2:
		return []message{{Role: "user", Content: g.text("mixed")}, {Role: "assistant", Content: ""}, {Role: "user", Content: empty()}}
	case 3:
		r := ""
		return []message{{Role: "user", Content: empty()}, {Role: "assistant", Content: "", Reasoning: &r}, {Role: "user", Content: ""}}
	default:
		return []message{{Role: "system", Content: empty()}, {Role: "user", Content: ""}}
	}
}

// --- prompt cases ---

func (g *gen) promptCase(cat string, i int) promptCase {
	p := promptCase{Name: fmt.Sprintf("prompt/%s/%03d", cat, i), Tags: []string{cat}, AddSpecialTokens: i%2 == 0}
	switch cat {
	case "empty":
		p.Text = g.pick([]string{"", "", " ", "\n", "\t", "  \n  "})
	case "long":
		p.Text = g.long("mixed")
	default:
		p.Text = g.text(cat)
		if g.chance(0.2) {
			p.Text = g.fragment(cat) // a fragment alone, edges included
		}
	}
	return p
}

// edgeCases are conversations in shapes Hugging Face's format allows and an OpenAI client cannot
// send (the pipeline test leaves them to TestExactChat): content as a list of parts, null, a
// number or an object; tool_calls null; kwargs of other types than the templates expect; numbers
// in tool arguments whose JSON forms differ between languages. Each is rendered, or refused, as
// Jinja2 does it.
func edgeCases() []json.RawMessage {
	tools := `[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {` +
		`"a": {"type": "number", "default": 1.5}, "n": {"type": "integer", "enum": [1, 2], "default": 1}, "ключ": {"type": "string", "description": "𝔘"},` +
		`"k2": {"type": ["string", "null"]}, "k3": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}}}}}]`
	call := `{"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": ` +
		`{"a": 1.0, "b": 1e20, "c": -0.0, "d": 1e-7, "e": 123456789012345678, "f": 0.1, "g": true, "h": null, "i": "é\u2028<>&'"}}}]}`
	result := `{"role": "tool", "tool_call_id": "abcdefghi", "content": "r"}`
	cases := []struct{ name, messages, tools, kwargs string }{
		{"no-messages", `[]`, "", ""},
		{"no-messages-tools", `[]`, tools, ""},
		{"parts", `[{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": " there"}]}]`, "", ""},
		{"parts-system", `[{"role": "system", "content": [{"type": "text", "text": "sys"}]}, {"role": "user", "content": [{"type": "text", "text": "a"}]}]`, "", ""},
		{"null-system", `[{"role": "system", "content": null}, {"role": "user", "content": "x"}]`, "", ""},
		{"null-user", `[{"role": "user", "content": null}]`, "", ""},
		{"number-content", `[{"role": "user", "content": 42}]`, "", ""},
		{"object-content", `[{"role": "user", "content": {"content": "inner"}}]`, "", ""},
		{"tool-object-content", `[{"role": "user", "content": "x"}, ` + call + `, {"role": "tool", "tool_call_id": "abcdefghi", "content": {"content": "inner"}}]`, tools, ""},
		{"number-arguments", `[{"role": "user", "content": "x"}, ` + call + `, ` + result + `]`, tools, ""},
		{"tool-without-description", `[{"role": "user", "content": "x"}]`, `[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]`, ""},
		{"tool-calls-null", `[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "tool_calls": null}, {"role": "user", "content": "z"}]`, "", ""},
		{"two-string-calls", `[{"role": "user", "content": "x"}, {"role": "assistant", "content": null, "tool_calls": [` +
			`{"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},` +
			`{"id": "abcdefghj", "type": "function", "function": {"name": "g", "arguments": "[]"}}]},` +
			`{"role": "tool", "tool_call_id": "abcdefghi", "content": "r1"}, {"role": "tool", "tool_call_id": "abcdefghj", "content": "r2"}, {"role": "assistant", "content": "done"}]`, "", ""},
		{"tool-first", `[{"role": "tool", "content": "r", "tool_call_id": "abcdefghi"}, {"role": "user", "content": "x"}]`, "", ""},
		{"assistant-first", `[{"role": "assistant", "content": "a"}, {"role": "user", "content": "x"}]`, "", ""},
		{"developer", `[{"role": "developer", "content": "dev"}, {"role": "user", "content": "x"}]`, "", ""},
		{"reasoning-last", `[{"role": "user", "content": "x"}, {"role": "assistant", "content": "a", "reasoning_content": "  think  \n", "thinking": "t"}]`, "", ""},
		{"think-edges", `[{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>\n \t r \n</think>\n\n \tanswer \t"}, {"role": "user", "content": "y"}]`, "", ""},
		{"effort-number", `[{"role": "user", "content": "x"}]`, "", `{"reasoning_effort": 1}`},
		{"builtin-tools-string", `[{"role": "user", "content": "x"}]`, "", `{"builtin_tools": "browser"}`},
		{"builtin-tools-object", `[{"role": "user", "content": "x"}]`, "", `{"builtin_tools": {"python": 1}}`},
		{"identity-null", `[{"role": "user", "content": "x"}]`, "", `{"model_identity": null}`},
		{"enable-thinking-string", `[{"role": "user", "content": "x"}]`, "", `{"enable_thinking": "no"}`},
	}
	out := make([]json.RawMessage, len(cases))
	for i, c := range cases {
		var b strings.Builder
		fmt.Fprintf(&b, `{"name":"chat/edge/%s","tags":["edge"`, c.name)
		if c.tools != "" {
			b.WriteString(`,"tools"`)
		}
		if c.kwargs != "" {
			b.WriteString(`,"kwargs"`)
		}
		fmt.Fprintf(&b, `],"messages":%s`, c.messages)
		if c.tools != "" {
			fmt.Fprintf(&b, `,"tools":%s`, c.tools)
		}
		b.WriteString(`,"add_generation_prompt":true`)
		if c.kwargs != "" {
			fmt.Fprintf(&b, `,"kwargs":%s`, c.kwargs)
		}
		b.WriteString("}")
		var v any
		if err := json.Unmarshal([]byte(b.String()), &v); err != nil {
			log.Fatalf("edge case %s: %v", c.name, err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(b.String())); err != nil {
			log.Fatal(err)
		}
		out[i] = compact.Bytes()
	}
	return out
}
