package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// A key may be created with a rate limit of its own: a valid one, within the environment's
// (422 otherwise), and from a calling key with a limit of its own, within that (403
// otherwise: no key mints a faster one). A refusal writes nothing. The key's limit is in its
// audit record's grants, so a limit changed in the table afterwards is caught.
func TestCreateKeyRateLimit(t *testing.T) {
	env := &capacity.RateLimit{PerSecond: 50, Burst: 100}
	limited := operator
	limited.RateLimit = &capacity.RateLimit{PerSecond: 5, Burst: 10}
	rate := func(r float64, b int) *capacity.RateLimit { return &capacity.RateLimit{PerSecond: r, Burst: b} }
	tests := []struct {
		name   string
		caller capacity.Principal
		limit  *capacity.RateLimit
		want   capacity.Code // "" for created
	}{
		{"none: the environment's", operator, nil, ""},
		{"lower than the environment's", operator, rate(2, 4), ""},
		{"equal to the environment's", operator, rate(50, 100), ""},
		{"rate above the environment's", operator, rate(51, 10), capacity.CodeInvalidRequest},
		{"burst above the environment's", operator, rate(1, 101), capacity.CodeInvalidRequest},
		{"zero rate", operator, rate(0, 1), capacity.CodeInvalidRequest},
		{"zero burst", operator, rate(1, 0), capacity.CodeInvalidRequest},
		{"the lowest rate", operator, rate(capacity.MinRatePerSecond, 1), ""},
		{"below the lowest rate", operator, rate(0.0009, 1), capacity.CodeInvalidRequest},
		{"a rate that would overflow to no limit", operator, rate(1e-13, 1), capacity.CodeInvalidRequest},
		{"a limited caller, within its limit", limited, rate(5, 10), ""},
		{"a limited caller, no limit", limited, nil, capacity.CodeForbidden},
		{"a limited caller, faster", limited, rate(6, 10), capacity.CodeForbidden},
		{"a limited caller, a larger burst", limited, rate(1, 11), capacity.CodeForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemKeys()
			svc := keyService(store)
			svc.RateLimit = env
			res, err := svc.CreateKey(context.Background(), tt.caller, capacity.KeyRequest{OrgID: "org-1",
				Permissions: []string{capacity.PermRead}, RateLimit: tt.limit, IdempotencyKey: "k1"}, capacity.RequestMeta{})
			if tt.want != "" {
				wantCode(t, err, tt.want)
				if len(store.keys) != 0 || len(store.audits) != 0 || len(store.idem) != 0 {
					t.Errorf("a refused creation wrote: keys %v, audits %v, idempotency %v", store.keys, store.audits, store.idem)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			stored := store.keys[res.Key.KeyID]
			if !sameRate(stored.RateLimit, tt.limit) || !sameRate(stored.Principal().RateLimit, tt.limit) {
				t.Errorf("stored key's limit %+v, want %+v", stored.RateLimit, tt.limit)
			}
			g := store.audits[0].Grants
			if g == nil || !sameRate(g.RateLimit, tt.limit) {
				t.Fatalf("audit grants %+v, want the key's limit %+v", g, tt.limit)
			}
			if rep := capacity.VerifyKeyGrants(chain(store.audits), []capacity.APIKey{stored}); !rep.OK {
				t.Errorf("the key as created does not match its record: %+v", rep)
			}
			changed := stored
			changed.RateLimit = rate(capacity.MaxRatePerSecond, capacity.MaxRateBurst)
			if rep := capacity.VerifyKeyGrants(chain(store.audits), []capacity.APIKey{changed}); rep.OK || rep.Problem != capacity.ChainAltered {
				t.Errorf("a limit raised in the table after creation: %+v, want altered", rep)
			}
		})
	}
}

func sameRate(a, b *capacity.RateLimit) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// chain gives records seqs as the store's chain does.
func chain(recs []capacity.AuditRecord) []capacity.AuditRecord {
	out := make([]capacity.AuditRecord, len(recs))
	var head capacity.AuditHead
	for i, r := range recs {
		out[i], head = capacity.ChainAuditRecord(r, head)
	}
	return out
}
