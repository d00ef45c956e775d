package capacity

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// KeyGrants is what an API key may do: the org it acts as, its permissions, the operator
// flag and its expiry. Every field of APIKey that widens or narrows what a key may do belongs
// here (GrantsOf), so that the key's audit records cover all of it.
//
// The tags are its attribute names in an audit item (AuditRecord.Grants).
type KeyGrants struct {
	OrgID       string     `dynamodbav:"orgId"`
	Permissions []string   `dynamodbav:"permissions"`
	Operator    bool       `dynamodbav:"operator"`
	ExpiresAt   *time.Time `dynamodbav:"expiresAt"`
	// RateLimit: the key's own rate limit (nil: its environment's).
	RateLimit *RateLimit `dynamodbav:"rateLimit,omitempty"`
}

// GrantsOf returns what k grants.
func GrantsOf(k APIKey) KeyGrants {
	return KeyGrants{OrgID: k.OrgID, Permissions: slices.Clone(k.Permissions), Operator: k.Operator, ExpiresAt: k.ExpiresAt, RateLimit: k.RateLimit}
}

// Equal reports whether g and o grant the same (permissions in any order, expiry as an
// instant).
func (g KeyGrants) Equal(o KeyGrants) bool {
	a, b := canonicalGrantsOf(&g), canonicalGrantsOf(&o)
	return a.OrgID == b.OrgID && slices.Equal(a.Permissions, b.Permissions) && a.Operator == b.Operator && a.ExpiresAt == b.ExpiresAt &&
		(a.RateLimit == nil) == (b.RateLimit == nil) && (a.RateLimit == nil || *a.RateLimit == *b.RateLimit)
}

// KeyReport is the outcome of checking the keys against the key-management chain: OK, or the
// first problem (Problem altered or inserted, naming KeyID and the record's Seq).
type KeyReport struct {
	OK bool
	// Checked counts the keys whose grants and revocation match their latest record.
	Checked int
	// Legacy names the keys whose records were written before records carried grants: their
	// grants cannot be checked. Unrecorded names the keys no chained record names: created
	// outside the API (seeded, or put straight into the table). Both are reported, never
	// passed silently.
	Legacy     []string
	Unrecorded []string

	Problem string
	KeyID   string
	Seq     int64
	Detail  string
}

// VerifyKeyGrants checks every key against the chained records of the key-management chain
// (verify the chain first: VerifyAuditChain). A key must grant what its latest record with
// grants says (altered otherwise), be revoked if a key.revoke record names it (altered), and
// be the only key with its id (inserted).
func VerifyKeyGrants(records []AuditRecord, keys []APIKey) KeyReport {
	var rep KeyReport
	latest := map[string]AuditRecord{} // key id -> its latest record with grants
	named := map[string]bool{}
	revokedBy := map[string]int64{}
	for _, r := range records {
		if r.Seq <= 0 || r.TargetKeyID == "" || !strings.HasPrefix(r.Action, "key.") {
			continue
		}
		named[r.TargetKeyID] = true
		if r.Grants != nil {
			latest[r.TargetKeyID] = r
		}
		if r.Action == ActionKeyRevoke {
			revokedBy[r.TargetKeyID] = r.Seq
		}
	}
	fail := func(problem string, k APIKey, seq int64, detail string) KeyReport {
		rep.Problem, rep.KeyID, rep.Seq, rep.Detail = problem, k.KeyID, seq, detail
		return rep
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.KeyID] {
			return fail(ChainInserted, k, 0, "a second key item with this id")
		}
		seen[k.KeyID] = true
		if seq, ok := revokedBy[k.KeyID]; ok && !k.Revoked {
			return fail(ChainAltered, k, seq, fmt.Sprintf("record %d revoked the key, but the key is not revoked", seq))
		}
		r, ok := latest[k.KeyID]
		switch {
		case ok && !GrantsOf(k).Equal(*r.Grants):
			return fail(ChainAltered, k, r.Seq, fmt.Sprintf("the key grants %s; record %d says %s", describeGrants(GrantsOf(k)), r.Seq, describeGrants(*r.Grants)))
		case ok:
			rep.Checked++
		case named[k.KeyID]:
			rep.Legacy = append(rep.Legacy, k.KeyID)
		default:
			rep.Unrecorded = append(rep.Unrecorded, k.KeyID)
		}
	}
	rep.OK = true
	return rep
}

func describeGrants(g KeyGrants) string {
	exp := "never"
	if g.ExpiresAt != nil {
		exp = g.ExpiresAt.UTC().Format(time.RFC3339)
	}
	rate := ""
	if g.RateLimit != nil {
		rate = ", rate limit " + describeRate(*g.RateLimit)
	}
	return fmt.Sprintf("org %s, permissions [%s], operator %t, expires %s%s", g.OrgID, strings.Join(canonicalGrantsOf(&g).Permissions, " "), g.Operator, exp, rate)
}
