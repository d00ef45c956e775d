package e2e

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeAPIURLIsTheStacks: the API URL the README's Quick start gives is the one this stack
// serves (its RestApi's stable id), so it works as written at every run.
func TestReadmeAPIURLIsTheStacks(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "API="+apiURL+" ") {
		t.Errorf("README.md does not set API=%s (the stack's ApiUrl)", apiURL)
	}
}
