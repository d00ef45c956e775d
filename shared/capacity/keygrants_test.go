package capacity

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// A key item changed in place no longer matches its records: each tampering fails
// VerifyKeyGrants; keys the chain cannot vouch for are reported, never passed silently.
func TestVerifyKeyGrants(t *testing.T) {
	exp := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	created := APIKey{KeyID: "key-1", OrgID: "acme", Permissions: []string{PermCapacity, PermRead}, ExpiresAt: &exp}
	record := func(seq int64, action string, k APIKey) AuditRecord {
		g := GrantsOf(k)
		return AuditRecord{ID: fmt.Sprintf("a%d", seq), Seq: seq, Action: action, TargetKeyID: k.KeyID, ActingFor: k.OrgID, Grants: &g}
	}
	later := exp.AddDate(1, 0, 0)
	tests := []struct {
		name    string
		records []AuditRecord
		keys    func(k APIKey) []APIKey
		problem string // "" = OK
		checked int
		legacy  []string
		unrec   []string
	}{
		{"as created", nil, func(k APIKey) []APIKey { return []APIKey{k} }, "", 1, nil, nil},
		{"revoked as recorded", []AuditRecord{record(2, ActionKeyRevoke, created)},
			func(k APIKey) []APIKey { k.Revoked = true; return []APIKey{k} }, "", 1, nil, nil},
		{"made operator in place", nil, func(k APIKey) []APIKey { k.Operator = true; return []APIKey{k} }, ChainAltered, 0, nil, nil},
		{"permission added in place", nil, func(k APIKey) []APIKey {
			k.Permissions = append(slices.Clone(k.Permissions), PermPlace)
			return []APIKey{k}
		}, ChainAltered, 0, nil, nil},
		{"expiry extended in place", nil, func(k APIKey) []APIKey { k.ExpiresAt = &later; return []APIKey{k} }, ChainAltered, 0, nil, nil},
		{"expiry removed in place", nil, func(k APIKey) []APIKey { k.ExpiresAt = nil; return []APIKey{k} }, ChainAltered, 0, nil, nil},
		{"moved to another org", nil, func(k APIKey) []APIKey { k.OrgID = "other"; return []APIKey{k} }, ChainAltered, 0, nil, nil},
		{"un-revoked", []AuditRecord{record(2, ActionKeyRevoke, created)}, func(k APIKey) []APIKey { return []APIKey{k} }, ChainAltered, 0, nil, nil},
		{"a second item with its id", nil, func(k APIKey) []APIKey {
			twin := k
			twin.Operator = true
			return []APIKey{k, twin}
		}, ChainInserted, 1, nil, nil},
		{"a key created before records carried grants", []AuditRecord{{ID: "a9", Seq: 9, Action: ActionKeyCreate, TargetKeyID: "key-old"}},
			func(k APIKey) []APIKey { return []APIKey{k, {KeyID: "key-old", OrgID: "acme", Operator: true}} }, "", 1, []string{"key-old"}, nil},
		{"a key no record names", nil,
			func(k APIKey) []APIKey { return []APIKey{k, {KeyID: "key-seeded", OrgID: "acme", Operator: true}} }, "", 1, nil, []string{"key-seeded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs := append([]AuditRecord{record(1, ActionKeyCreate, created)}, tt.records...)
			rep := VerifyKeyGrants(recs, tt.keys(created))
			if rep.OK != (tt.problem == "") || rep.Problem != tt.problem || rep.Checked != tt.checked ||
				!slices.Equal(rep.Legacy, tt.legacy) || !slices.Equal(rep.Unrecorded, tt.unrec) {
				t.Fatalf("report %+v, want problem %q, %d checked, legacy %v, unrecorded %v", rep, tt.problem, tt.checked, tt.legacy, tt.unrec)
			}
			if tt.problem != "" && rep.KeyID != "key-1" {
				t.Errorf("problem names key %q, want key-1", rep.KeyID)
			}
		})
	}
}
