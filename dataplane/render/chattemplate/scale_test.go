package chattemplate

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// qwenLike has the constructs of Qwen3's template whose cost grows with the conversation.
const qwenLike = `{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "assistant" and '</think>' in message.content %}
        {{- '<|im_start|>' + message.role + '\n' + message.content.split('</think>')[-1].lstrip('\n') + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}`

func conversation(n int) json.RawMessage {
	msgs := make([]map[string]string, n)
	for i := range msgs {
		role := []string{"user", "assistant"}[i%2]
		msgs[i] = map[string]string{"role": role, "content": strings.Repeat("word ", 40) + "</think>\n" + strings.Repeat("é", 20)}
	}
	data, _ := json.Marshal(msgs)
	return data
}

// allocated returns the fewest bytes one of three renders of n messages allocated.
func allocated(t *testing.T, tmpl *Template, n int) uint64 {
	t.Helper()
	msgs := conversation(n)
	best := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := tmpl.Render(msgs, Options{}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	return best
}

// TestRenderScalesLinearly renders 4× the messages and expects about 4× the allocation (the
// engine's work is dominated by the strings it builds); a template that accumulates the
// conversation in a variable is the quadratic control the measurement must catch.
func TestRenderScalesLinearly(t *testing.T) {
	for _, tc := range []struct {
		name      string
		template  string
		quadratic bool
	}{
		{"qwen-like", qwenLike, false},
		{"accumulating (control)", `{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s + m.content %}{% endfor %}{{ ns.s|length }}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := loadInline(t, tc.template)
			small, large := allocated(t, tmpl, 250), allocated(t, tmpl, 1000)
			ratio := float64(large) / float64(small)
			t.Logf("250 messages: %d B, 1000 messages: %d B, ratio %.1f", small, large, ratio)
			if quadratic := ratio > 8; quadratic != tc.quadratic {
				t.Errorf("allocation ratio %.1f for 4x the messages: quadratic=%t, want %t", ratio, quadratic, tc.quadratic)
			}
		})
	}
}

// TestRenderConcurrently shares one Template between goroutines (meaningful under -race).
func TestRenderConcurrently(t *testing.T) {
	tmpl := loadInline(t, qwenLike+`{{ messages[0] | tojson }}{{ strftime_now('%Y') | length }}`)
	want, err := tmpl.Render(conversation(5), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 20 {
				got, err := tmpl.Render(conversation(5), Options{})
				if err == nil && got != want {
					err = fmt.Errorf("got %q, want %q", got, want)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
