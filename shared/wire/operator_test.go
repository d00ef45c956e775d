package wire_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// fullRecord sets every field of an audit record to a non-zero value, so that a field the
// wire form forgets shows up in the round trip.
func fullRecord() capacity.AuditRecord {
	return capacity.AuditRecord{
		ID: "aud-1", Time: time.Date(2026, 11, 2, 3, 4, 5, 123456789, time.UTC), RequestID: "req-1",
		ActorKeyID: "key-1", CallerOrgID: "org-1", ActingFor: "owner", Action: capacity.ActionReclaim,
		NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1", "u2"}, DryRun: true, Reason: "why ✓",
		ReclaimID: "rc-1", Terminated: []string{"vm-1"}, Skipped: []string{"vm-2"},
		ReleasedBefore: []string{"u1"}, ReleasedAfter: []string{"u3"}, TopologyGen: 7, VMID: "vm-9",
		Outcome: "ok", Via: capacity.ViaEvent, EventID: "ev-1", TargetKeyID: "key-7",
		Victims: []capacity.Victim{{VMID: "vm-1", OrgID: "buyer", UnitIDs: []string{"u1"}}, {VMID: "vm-3", OrgID: "b2"}},
		Start:   &capacity.ChainStart{Unchained: 2, Digest: strings.Repeat("c", 64)},
		Grants: &capacity.KeyGrants{OrgID: "org-2", Permissions: []string{"reservation.read"}, Operator: true,
			ExpiresAt: func() *time.Time { at := time.Date(2027, 1, 2, 3, 4, 5, 6, time.UTC); return &at }()},
		Seq: 42, PrevHash: strings.Repeat("a", 64), Hash: strings.Repeat("b", 64),
	}
}

// TestAuditRecordRoundTrip: a record survives AuditRecord, JSON, AuditRecordFrom unchanged
// (time in UTC with its nanoseconds; empty lists read back as nil) and with the same hash.
func TestAuditRecordRoundTrip(t *testing.T) {
	full := fullRecord()
	// Every field of the domain record is set, so the comparison below covers them all.
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fullRecord leaves %s zero", v.Type().Field(i).Name)
		}
	}
	empty := capacity.AuditRecord{ID: "aud-2", Time: time.Date(2026, 1, 1, 0, 0, 0, 1, time.FixedZone("x", 3600)),
		UnitIDs: []string{}, Terminated: []string{}, Victims: []capacity.Victim{{VMID: "v", UnitIDs: []string{}}}}
	for _, tc := range []struct {
		name string
		in   capacity.AuditRecord
		want capacity.AuditRecord
	}{
		{"every field", full, full},
		{"zero", capacity.AuditRecord{}, capacity.AuditRecord{Time: time.Time{}.UTC()}},
		{"empty lists read back as nil, time in UTC", empty, capacity.AuditRecord{ID: "aud-2",
			Time: empty.Time.UTC(), Victims: []capacity.Victim{{VMID: "v"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(wire.AuditRecord(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			var j wire.AuditRecordJSON
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&j); err != nil {
				t.Fatal(err)
			}
			got, err := wire.AuditRecordFrom(j)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("round trip\n got %+v\nwant %+v", got, tc.want)
			}
			if h1, h2 := capacity.HashAuditRecord(tc.in), capacity.HashAuditRecord(got); h1 != h2 {
				t.Errorf("hash changed in the round trip: %s, then %s", h1, h2)
			}
		})
	}
}

// TestAuditRecordJSONMembers: every member is always present and lists are [] (never null),
// so a client sees one form to hash.
func TestAuditRecordJSONMembers(t *testing.T) {
	data, err := json.Marshal(wire.AuditRecord(capacity.AuditRecord{Victims: []capacity.Victim{{VMID: "v"}}}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	want := []string{"id", "seq", "prevHash", "hash", "time", "requestId", "actorKeyId", "callerOrgId", "actingFor",
		"action", "nodeId", "reservationId", "unitIds", "dryRun", "reason", "reclaimId", "terminated", "skipped",
		"releasedBefore", "releasedAfter", "topologyGen", "vmId", "outcome", "via", "eventId", "victims", "targetKeyId"}
	if len(m) != len(want) {
		t.Errorf("members %d, want %d: %s", len(m), len(want), data)
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("member %q missing: %s", k, data)
		}
	}
	for _, k := range []string{"unitIds", "terminated", "skipped", "releasedBefore", "releasedAfter"} {
		if string(m[k]) != "[]" {
			t.Errorf("%s = %s, want []", k, m[k])
		}
	}
	if !strings.Contains(string(m["victims"]), `"unitIds":[]`) {
		t.Errorf("victims = %s, want unitIds []", m["victims"])
	}
}

// TestAuditRecordFromBadTime: a time that is not RFC 3339 is an error, not a zero time.
func TestAuditRecordFromBadTime(t *testing.T) {
	for _, s := range []string{"", "yesterday", "2026-11-02 03:04:05Z"} {
		if _, err := wire.AuditRecordFrom(wire.AuditRecordJSON{ID: "a", Time: s}); err == nil {
			t.Errorf("time %q accepted", s)
		}
	}
}

func TestNodeJSON(t *testing.T) {
	rotated := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		node capacity.Node
		want string
	}{
		{capacity.Node{ID: "n1", OwnerOrgID: "o", TopologyGen: 2, Version: 3, AuditHead: capacity.AuditHead{Seq: 4, Hash: "h"}},
			`{"nodeId":"n1","ownerOrgId":"o","unitIds":[],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":4,"hash":"h"},"agentKeyGen":0}`},
		// The sealed keys are never shown.
		{capacity.Node{ID: "n1", OwnerOrgID: "o", TopologyGen: 2, Version: 3, AgentKeyGen: 2, AgentKey: []byte("sealed"), PrevAgentKey: []byte("old"), AgentKeyRotatedAt: rotated},
			`{"nodeId":"n1","ownerOrgId":"o","unitIds":[],"agentEndpoint":"","topologyGen":2,"version":3,"auditHead":{"seq":0,"hash":""},"agentKeyGen":2,"agentKeyRotatedAt":"2027-01-02T03:04:05Z"}`},
	} {
		data, err := json.Marshal(wire.Node(tc.node))
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != tc.want {
			t.Errorf("node JSON\n got %s\nwant %s", data, tc.want)
		}
	}
}

// TestKeyWithoutCreationTime: a key that records no creation time shows no createdAt, never
// "" (which is no date-time).
func TestKeyWithoutCreationTime(t *testing.T) {
	raw, err := json.Marshal(wire.Key(capacity.APIKey{KeyID: "key-1", OrgID: "org-1"}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), `"createdAt"`) {
		t.Errorf("key without a creation time shows %s", raw)
	}
}

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
