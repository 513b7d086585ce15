package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// The coordinator image declares the schema this tree reads.
func TestImageLabelIsTheSchemaVersion(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile.coordinator")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`%s="%d"`, SchemaLabel, SchemaVersion)
	if !strings.Contains(string(data), want) {
		t.Fatalf("Dockerfile.coordinator has no LABEL %s: bump the label with SchemaVersion", want)
	}
}
