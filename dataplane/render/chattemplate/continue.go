package chattemplate

import (
	"errors"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// continueFinal cuts rendered right after the final message's content, as transformers does for
// continue_final_message.
func continueFinal(rendered string, msgs *jinja.List) (string, error) {
	if msgs.Len() == 0 {
		return "", errors.New("chattemplate: continue_final_message needs a final message")
	}
	content, _ := msgs.Get(msgs.Len() - 1).AsDict().Get("content")
	final := ""
	switch {
	case content.IsString():
		final = content.AsString()
	case content.IsList():
		found := false
		for i := content.AsList().Len() - 1; i >= 0 && !found; i-- {
			if part := content.AsList().Get(i); part.IsDict() {
				if text, ok := part.AsDict().Get("text"); ok {
					final, found = pyStr(text), true
				}
			}
		}
		if !found {
			return "", errors.New("chattemplate: continue_final_message is set but the final message has no text to continue")
		}
	default:
		return "", errors.New("chattemplate: continue_final_message is set but the final message has no text to continue")
	}
	stripped := pyStrip(final, nil)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", errors.New("chattemplate: continue_final_message is set but the final message does not appear in the rendered chat")
	}
	if n := loc + len(strings.TrimLeftFunc(final, pyIsSpace)); n <= len(rendered) && rendered[loc:n] == final {
		return rendered[:n], nil
	}
	return rendered[:loc+len(stripped)], nil
}
