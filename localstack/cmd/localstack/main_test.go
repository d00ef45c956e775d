package main

import (
	"path/filepath"
	"testing"

	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/stackoutput"
)

// A stack on another port writes its outputs apart, so capacityctl keeps reading the first
// stack's .local/outputs.json.
func TestOutputsPathByAddress(t *testing.T) {
	for _, tt := range []struct{ addr, want string }{
		{"127.0.0.1:4566", ".local/outputs.json"},
		{"127.0.0.1:4567", ".local/outputs-4567.json"},
		{"[::1]:5000", ".local/outputs-5000.json"},
		{"no-port", ".local/outputs.json"},
	} {
		if got := outputsPath(tt.addr); got != tt.want {
			t.Errorf("outputsPath(%q) = %s, want %s", tt.addr, got, tt.want)
		}
	}
}

// The agent simulator's URL is in the outputs file beside the stack's outputs, so that it can
// be found after make run's banner has scrolled away.
func TestOutputsFileNamesTheAgentSimulator(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".local", "outputs.json")
	stackOut := map[string]string{stackoutput.ApiUrl: "http://127.0.0.1:4566/restapis/a/local/_user_request_"}
	if err := writeOutputs(path, "capacity-local", stackOut, "http://127.0.0.1:4580"); err != nil {
		t.Fatal(err)
	}
	name, got, err := stack.ReadOutputsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if name != "capacity-local" || got[stackoutput.AgentSimulatorUrl] != "http://127.0.0.1:4580" || got[stackoutput.ApiUrl] != stackOut[stackoutput.ApiUrl] {
		t.Errorf("outputs file: %s %v", name, got)
	}
	if _, ok := stackOut[stackoutput.AgentSimulatorUrl]; ok {
		t.Error("writeOutputs changed the stack's outputs")
	}
}
