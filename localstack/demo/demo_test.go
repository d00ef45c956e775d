package demo_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// The demo keys are of the one accepted format: otherwise the README's examples get 401.
func TestDemoKeysAreWellFormed(t *testing.T) {
	for _, k := range demo.Keys() {
		if err := capacity.CheckKeySecret(k.Secret); err != nil {
			t.Errorf("demo key %s: %v", k.Name, err)
		}
	}
}

// TestDemoKeysAnswerTheirCreationTime: each seeded key, as the API shows it, has a createdAt
// that is a date-time (the contract's format), the time it was seeded.
func TestDemoKeysAnswerTheirCreationTime(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, k := range demo.Seed(at).Keys {
		raw, err := json.Marshal(wire.Key(k))
		if err != nil {
			t.Fatal(err)
		}
		var shown struct {
			CreatedAt *string `json:"createdAt"`
		}
		if err := json.Unmarshal(raw, &shown); err != nil || shown.CreatedAt == nil {
			t.Fatalf("key %s shows no createdAt: %s", k.KeyID, raw)
		}
		if got, err := time.Parse(time.RFC3339, *shown.CreatedAt); err != nil || !got.Equal(at) {
			t.Errorf("key %s: createdAt %q, want %s", k.KeyID, *shown.CreatedAt, at.Format(time.RFC3339))
		}
	}
}
