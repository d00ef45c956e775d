package demo_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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

// TestPublishedDemoKeysAreSeeded: every demo key secret the README, the docs and the sample
// events show is one the local stack seeds, so a copied example is not answered 401.
func TestPublishedDemoKeysAreSeeded(t *testing.T) {
	seeded := map[string]bool{}
	for _, k := range demo.Keys() {
		seeded[k.Secret] = true
	}
	secret := regexp.MustCompile(`ocap_demo[0-9A-Za-z]+`)
	var files []string
	for _, pattern := range []string{"../../README.md", "../../docs/*.md", "../../docs/*/*.md", "../../events/*.json"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	found := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secret.FindAllString(string(data), -1) {
			found++
			if !seeded[s] {
				t.Errorf("%s shows %s, which is no demo key", f, s)
			}
		}
	}
	if found == 0 {
		t.Fatalf("no demo key found in %v: the check would pass whatever they show", files)
	}
}
