package stack

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLocalExecuteAPIURL(t *testing.T) {
	const endpoint = "http://127.0.0.1:4566"

	apis := map[string]string{"a1b2c3-d4": "0123456789"} // kumo's id -> the stable one

	tests := map[string]string{
		// The stage's root without its trailing slash: "$API/v1/..." must not double it.
		"https://a1b2c3-d4.execute-api.us-east-1.amazonaws.com/local/":         endpoint + "/restapis/0123456789/local/_user_request_",
		"https://a1b2c3-d4.execute-api.us-east-1.amazonaws.com/local/v1/nodes": endpoint + "/restapis/0123456789/local/_user_request_/v1/nodes",
		"https://a1b2c3-d4.execute-api.us-east-1.amazonaws.com/local":          endpoint + "/restapis/0123456789/local/_user_request_",
		// Not one of the stack's APIs, or not an execute-api URL: unchanged.
		"https://other.execute-api.us-east-1.amazonaws.com/local/": "https://other.execute-api.us-east-1.amazonaws.com/local/",
		"https://a1b2c3-d4.execute-api.us-east-1.amazonaws.com/":   "https://a1b2c3-d4.execute-api.us-east-1.amazonaws.com/",
		"capacity-local-state": "capacity-local-state",
		"":                     "",
	}

	for in, want := range tests {
		if got := localExecuteAPIURL(in, endpoint, apis); got != want {
			t.Errorf("localExecuteAPIURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOutputsFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nested", "outputs.json")
	outputs := map[string]string{"ApiUrl": "http://127.0.0.1:4566/restapis/x/local/_user_request_", "TableName": "t"}

	if err := WriteOutputsFile(path, "capacity-local", outputs); err != nil {
		t.Fatal(err)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	// The shape of `cdk deploy --outputs-file`.
	want := `{
  "capacity-local": {
    "ApiUrl": "http://127.0.0.1:4566/restapis/x/local/_user_request_",
    "TableName": "t"
  }
}
`
	if string(data) != want {
		t.Errorf("file:\n%s\nwant:\n%s", data, want)
	}

	name, got, err := ReadOutputsFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if name != "capacity-local" || !maps.Equal(got, outputs) {
		t.Errorf("read %q %v", name, got)
	}

	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestReadOutputsFileErrors(t *testing.T) {
	dir := t.TempDir()

	tests := map[string]string{
		"two stacks": `{"a": {}, "b": {}}`,
		"no stack":   `{}`,
		"not JSON":   `{`,
		"wrong type": `{"a": {"k": 1}}`,
	}

	for name, content := range tests {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}

		if _, _, err := ReadOutputsFile(path); err == nil {
			t.Errorf("%s: no error", name)
		}
	}

	if _, _, err := ReadOutputsFile(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file: no error")
	}
}
