package demo_test

import (
	"testing"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
)

// The demo keys are of the one accepted format: otherwise the README's examples get 401.
func TestDemoKeysAreWellFormed(t *testing.T) {
	for _, k := range demo.Keys() {
		if err := capacity.CheckKeySecret(k.Secret); err != nil {
			t.Errorf("demo key %s: %v", k.Name, err)
		}
	}
}
