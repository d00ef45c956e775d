package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"
)

// TestHashAuditRecordEveryMember pins the canonical text of records that carry every member:
// victims, a target key, grants with an expiry and a rate limit, and the chain's start. Times
// in other zones are hashed in UTC, permissions sorted, lists [] when empty.
func TestHashAuditRecordEveryMember(t *testing.T) {
	exp := time.Date(2027, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	const lists = `"requestId":"q","actorKeyId":"k1","callerOrgId":"o1","actingFor":"o2","action":"reclaim",` +
		`"nodeId":"n1","reservationId":"r1","unitIds":["u1","u2"],"dryRun":true,"reason":"why","reclaimId":"rc",` +
		`"terminated":["v1"],"skipped":["v3"],"releasedBefore":["u1"],"releasedAfter":[],"topologyGen":7,` +
		`"vmId":"v9","outcome":"ok","via":"event","eventId":"e1",`
	base := AuditRecord{ID: "a", Seq: 3, PrevHash: "p", Hash: "h", Time: time.Date(2026, 1, 2, 3, 4, 5, 7, time.FixedZone("y", -7200)),
		RequestID: "q", ActorKeyID: "k1", CallerOrgID: "o1", ActingFor: "o2", Action: ActionReclaim, NodeID: "n1",
		ReservationID: "r1", UnitIDs: []string{"u1", "u2"}, DryRun: true, Reason: "why", ReclaimID: "rc",
		Terminated: []string{"v1"}, Skipped: []string{"v3"}, ReleasedBefore: []string{"u1"}, TopologyGen: 7,
		VMID: "v9", Outcome: "ok", Via: ViaEvent, EventID: "e1"}
	for _, tc := range []struct {
		name string
		edit func(*AuditRecord)
		text string
	}{
		{"victims", func(r *AuditRecord) {
			r.Victims = []Victim{{VMID: "v1", OrgID: "b"}, {VMID: "v2", OrgID: "c", UnitIDs: []string{"u1"}}}
		}, `{"id":"a","seq":3,"prevHash":"p","time":"2026-01-02T05:04:05.000000007Z",` + lists +
			`"victims":[{"vmId":"v1","orgId":"b","unitIds":[]},{"vmId":"v2","orgId":"c","unitIds":["u1"]}]}`},
		{"key record with a start", func(r *AuditRecord) {
			r.TargetKeyID = "k"
			r.Grants = &KeyGrants{OrgID: "o", Permissions: []string{"z", "a"}, Operator: true, ExpiresAt: &exp, RateLimit: &RateLimit{PerSecond: 0.5, Burst: 2}}
			r.Start = &ChainStart{Unchained: 4, Digest: "d"}
		}, `{"id":"a","seq":3,"prevHash":"p","time":"2026-01-02T05:04:05.000000007Z",` + lists + `"victims":[],"targetKeyId":"k",` +
			`"grants":{"orgId":"o","permissions":["a","z"],"operator":true,"expiresAt":"2027-01-02T02:04:05.000000006Z","rateLimit":{"perSecond":0.5,"burst":2}},` +
			`"start":{"unchained":4,"digest":"d"}}`},
		{"a start without a target key", func(r *AuditRecord) { r.Start = &ChainStart{Unchained: 0, Digest: "d"} },
			`{"id":"a","seq":3,"prevHash":"p","time":"2026-01-02T05:04:05.000000007Z",` + lists + `"victims":[],"start":{"unchained":0,"digest":"d"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.edit(&r)
			sum := sha256.Sum256([]byte(tc.text))
			if got, want := HashAuditRecord(r), hex.EncodeToString(sum[:]); got != want {
				t.Errorf("hash %s, want the hash of %s", got, tc.text)
			}
		})
	}
}
