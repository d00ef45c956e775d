package wire_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// TestAuditRecordJSONText pins the API's audit record byte for byte: member order, times in
// UTC with nanoseconds, lists [] when empty, permissions as the key holds them, grants and
// start only where set.
func TestAuditRecordJSONText(t *testing.T) {
	exp := time.Date(2027, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	const empty = `"requestId":"","actorKeyId":"","callerOrgId":"","actingFor":"","action":"","nodeId":"","reservationId":"",` +
		`"unitIds":[],"dryRun":false,"reason":"","reclaimId":"","terminated":[],"skipped":[],"releasedBefore":[],` +
		`"releasedAfter":[],"topologyGen":0,"vmId":"","outcome":"","via":"","eventId":"",`
	full := capacity.AuditRecord{ID: "a", Seq: 3, PrevHash: "p", Hash: "h", Time: time.Date(2026, 1, 2, 3, 4, 5, 7, time.FixedZone("y", -7200)),
		Victims: []capacity.Victim{{VMID: "v1", OrgID: "b"}, {VMID: "v2", OrgID: "c", UnitIDs: []string{"u1"}}},
		Grants:  &capacity.KeyGrants{OrgID: "o", Permissions: []string{"z", "a"}, Operator: true, ExpiresAt: &exp},
		Start:   &capacity.ChainStart{Unchained: 4, Digest: "d"}}
	for _, tc := range []struct {
		name string
		in   capacity.AuditRecord
		want string
	}{
		{"zero", capacity.AuditRecord{}, `{"id":"","seq":0,"prevHash":"","hash":"","time":"0001-01-01T00:00:00Z",` + empty +
			`"victims":[],"targetKeyId":""}`},
		{"victims, grants and start", full, `{"id":"a","seq":3,"prevHash":"p","hash":"h","time":"2026-01-02T05:04:05.000000007Z",` + empty +
			`"victims":[{"vmId":"v1","orgId":"b","unitIds":[]},{"vmId":"v2","orgId":"c","unitIds":["u1"]}],"targetKeyId":"",` +
			`"grants":{"orgId":"o","permissions":["z","a"],"operator":true,"expiresAt":"2027-01-02T02:04:05.000000006Z"},` +
			`"start":{"unchained":4,"digest":"d"}}`},
		{"grants without an expiry", capacity.AuditRecord{TargetKeyID: "k", Grants: &capacity.KeyGrants{OrgID: "o"}},
			`{"id":"","seq":0,"prevHash":"","hash":"","time":"0001-01-01T00:00:00Z",` + empty +
				`"victims":[],"targetKeyId":"k","grants":{"orgId":"o","permissions":[],"operator":false}}`},
		{"grants with a rate limit", capacity.AuditRecord{TargetKeyID: "k", Grants: &capacity.KeyGrants{OrgID: "o", RateLimit: &capacity.RateLimit{PerSecond: 0.5, Burst: 2}}},
			`{"id":"","seq":0,"prevHash":"","hash":"","time":"0001-01-01T00:00:00Z",` + empty +
				`"victims":[],"targetKeyId":"k","grants":{"orgId":"o","permissions":[],"operator":false,"rateLimit":{"perSecond":0.5,"burst":2}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(wire.AuditRecord(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != tc.want {
				t.Errorf("JSON\n got %s\nwant %s", data, tc.want)
			}
		})
	}
}
