package main

import "testing"

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
