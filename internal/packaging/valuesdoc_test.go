package packaging

import (
	"strings"
	"testing"
)

func TestValuesTable(t *testing.T) {
	values := `# File header, not a description.

# -- The image.
image:
  repository: example.com/op
  # Or a digest.
  digest: ""
# -- Labels | of <pods>.
podLabels: {a: "1"}
replicas: 2
list: [x]
`
	schema := `{
  "definitions": {"img": {"type": "object", "properties": {"repository": {"type": "string", "description": "Repository."}, "digest": {"type": "string"}}}},
  "properties": {
    "image": {"$ref": "#/definitions/img"},
    "podLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "replicas": {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "Replicas."},
    "list": {"type": "array", "description": "A list."}
  }
}`
	got, err := ValuesTable([]byte(values), []byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	want := "| Key | Type | Default | Description |\n|-----|------|---------|-------------|\n" +
		"| `image` | object |  | The image. |\n" +
		"| `image.repository` | string | `\"example.com/op\"` | Repository. |\n" +
		"| `image.digest` | string | `\"\"` | Or a digest. |\n" +
		"| `podLabels` | object | `{\"a\":\"1\"}` | Labels \\| of &lt;pods&gt;. |\n" +
		"| `replicas` | integer or string | `2` | Replicas. |\n" +
		"| `list` | array | `[\"x\"]` | A list. |\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	_, err = ValuesTable([]byte("a: 1\nb:\n  c: x\n"), []byte(`{"properties": {"b": {"properties": {"c": {}}}}}`))
	if err == nil || !strings.Contains(err.Error(), "for a, b.c") {
		t.Errorf("want an error naming a and b.c, got %v", err)
	}
}
