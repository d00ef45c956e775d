package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"
)

// chain builds n chained records of one node, one second apart, and the head after them.
func testChain(n int) ([]AuditRecord, AuditHead) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	var head AuditHead
	var recs []AuditRecord
	for i := 1; i <= n; i++ {
		r := AuditRecord{ID: fmt.Sprintf("a%d", i), Time: t0.Add(time.Duration(i) * time.Second), NodeID: "n1",
			Action: ActionReclaim, DryRun: i%2 == 0, Outcome: "ok", UnitIDs: []string{"u0"}}
		r, head = ChainAuditRecord(r, head)
		recs = append(recs, r)
	}
	return recs, head
}

func TestHashAuditRecordCanonical(t *testing.T) {
	base := AuditRecord{ID: "a", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), Seq: 1}
	nilLists := HashAuditRecord(base)
	empty := base
	empty.UnitIDs, empty.Terminated, empty.Victims = []string{}, []string{}, []Victim{}
	if HashAuditRecord(empty) != nilLists {
		t.Error("nil and empty lists hash differently")
	}
	utc := base
	utc.Time = base.Time.UTC()
	if HashAuditRecord(utc) != nilLists {
		t.Error("the same instant in another zone hashes differently")
	}
	withHash := base
	withHash.Hash = "anything"
	if HashAuditRecord(withHash) != nilLists {
		t.Error("Hash is part of the hashed content")
	}
	for name, change := range map[string]func(*AuditRecord){
		"seq":         func(r *AuditRecord) { r.Seq = 2 },
		"prevHash":    func(r *AuditRecord) { r.PrevHash = "p" },
		"victims":     func(r *AuditRecord) { r.Victims = []Victim{{VMID: "v", OrgID: "b"}} },
		"dryRun":      func(r *AuditRecord) { r.DryRun = true },
		"via":         func(r *AuditRecord) { r.Via = ViaEvent },
		"targetKeyId": func(r *AuditRecord) { r.TargetKeyID = "key-1" },
		"grants":      func(r *AuditRecord) { r.Grants = &KeyGrants{OrgID: "o"} },
		"start":       func(r *AuditRecord) { r.Start = &ChainStart{Digest: "d"} },
	} {
		r := base
		change(&r)
		if HashAuditRecord(r) == nilLists {
			t.Errorf("%s is not covered by the hash", name)
		}
	}
}

// TestHashAuditRecordForm pins the canonical text: records without a target key hash as they
// did before the member existed, so chains written then still verify.
func TestHashAuditRecordForm(t *testing.T) {
	base := AuditRecord{ID: "a", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Seq: 1, Action: ActionKeyRevoke}
	const form = `{"id":"a","seq":1,"prevHash":"","time":"2026-01-02T03:04:05Z","requestId":"","actorKeyId":"",` +
		`"callerOrgId":"","actingFor":"","action":"key.revoke","nodeId":"","reservationId":"","unitIds":[],` +
		`"dryRun":false,"reason":"","reclaimId":"","terminated":[],"skipped":[],"releasedBefore":[],` +
		`"releasedAfter":[],"topologyGen":0,"vmId":"","outcome":"","via":"","eventId":"","victims":[]`
	exp := time.Date(2027, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		target string
		grants *KeyGrants
		text   string
	}{
		{"", nil, form + "}"},
		{"key-1", nil, form + `,"targetKeyId":"key-1"}`},
		{"key-1", &KeyGrants{OrgID: "o", Permissions: []string{"vm.place", "reservation.read"}, Operator: true, ExpiresAt: &exp},
			form + `,"targetKeyId":"key-1","grants":{"orgId":"o","permissions":["reservation.read","vm.place"],"operator":true,"expiresAt":"2027-01-02T02:04:05Z"}}`},
		{"key-1", &KeyGrants{OrgID: "o"},
			form + `,"targetKeyId":"key-1","grants":{"orgId":"o","permissions":[],"operator":false,"expiresAt":""}}`},
		{"key-1", &KeyGrants{OrgID: "o", RateLimit: &RateLimit{PerSecond: 2.5, Burst: 5}},
			form + `,"targetKeyId":"key-1","grants":{"orgId":"o","permissions":[],"operator":false,"expiresAt":"","rateLimit":{"perSecond":2.5,"burst":5}}}`},
	} {
		r := base
		r.TargetKeyID, r.Grants = tc.target, tc.grants
		sum := sha256.Sum256([]byte(tc.text))
		if got, want := HashAuditRecord(r), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("target %q: hash %s, want the hash of %s", tc.target, got, tc.text)
		}
	}
}

func TestVerifyAuditChain(t *testing.T) {
	forge := func(r AuditRecord, rehash bool) AuditRecord {
		r.ID, r.Reason = "forged", "nothing to see"
		if rehash {
			r.Hash = HashAuditRecord(r)
		}
		return r
	}
	legacy := AuditRecord{ID: "old", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), NodeID: "n1", Action: ActionRelease}
	tests := []struct {
		name string
		edit func(recs []AuditRecord, head AuditHead) ([]AuditRecord, AuditHead)
		want ChainReport
	}{
		{"clean chain", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) { return r, h },
			ChainReport{OK: true, Checked: 5}},
		{"empty chain", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) { return nil, AuditHead{} },
			ChainReport{OK: true}},
		{"unchained records before the chain are counted", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return append([]AuditRecord{legacy}, r...), h
		}, ChainReport{OK: true, Checked: 5, Unchained: 1}},
		{"records past the head are verified and counted", func(r []AuditRecord, _ AuditHead) ([]AuditRecord, AuditHead) {
			return r, AuditHead{Seq: r[2].Seq, Hash: r[2].Hash}
		}, ChainReport{OK: true, Checked: 3, Past: 2}},
		{"a record past the head altered", func(r []AuditRecord, _ AuditHead) ([]AuditRecord, AuditHead) {
			r[4].Reason = "rewritten"
			return r, AuditHead{Seq: r[2].Seq, Hash: r[2].Hash}
		}, ChainReport{Problem: ChainAltered, Seq: 5, RecordID: "a5", Checked: 3, Past: 1}},
		{"a record past the head removed", func(r []AuditRecord, _ AuditHead) ([]AuditRecord, AuditHead) {
			return append(r[:3:3], r[4]), AuditHead{Seq: r[2].Seq, Hash: r[2].Hash}
		}, ChainReport{Problem: ChainRemoved, Seq: 5, RecordID: "a5", MissingFrom: 4, MissingTo: 4, Checked: 3}},
		{"one field altered", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			r[2].DryRun = !r[2].DryRun
			return r, h
		}, ChainReport{Problem: ChainAltered, Seq: 3, RecordID: "a3", Checked: 2}},
		{"forged record, hash not recomputed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return insert(r, 3, forge(r[2], false)), h
		}, ChainReport{Problem: ChainInserted, Seq: 3, RecordID: "forged", Checked: 3}},
		{"forged record, hash recomputed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return insert(r, 2, forge(r[2], true)), h
		}, ChainReport{Problem: ChainInserted, Seq: 3, RecordID: "forged", Checked: 2}},
		{"forged record after the genuine one", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return insert(r, 3, forge(r[2], true)), h
		}, ChainReport{Problem: ChainInserted, Seq: 3, RecordID: "forged", Checked: 3}},
		{"unchained record after the chain began", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			late := legacy
			late.ID, late.Time = "late", r[3].Time
			return append([]AuditRecord{late}, r...), h
		}, ChainReport{Problem: ChainInserted, RecordID: "late"}},
		{"middle record removed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return append(r[:2:2], r[3:]...), h
		}, ChainReport{Problem: ChainRemoved, Seq: 4, RecordID: "a4", MissingFrom: 3, MissingTo: 3, Checked: 2}},
		{"last record removed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return r[:4], h
		}, ChainReport{Problem: ChainRemoved, Seq: 4, RecordID: "a4", MissingFrom: 5, MissingTo: 5, Checked: 4}},
		{"last records removed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return r[:2], h
		}, ChainReport{Problem: ChainRemoved, Seq: 2, RecordID: "a2", MissingFrom: 3, MissingTo: 5, Checked: 2}},
		{"every record removed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			return nil, h
		}, ChainReport{Problem: ChainRemoved, MissingFrom: 1, MissingTo: 5}},
		{"record replaced by one rehashed on the same link", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			r[2] = forge(r[2], true)
			return r, h
		}, ChainReport{Problem: ChainRemoved, Seq: 4, RecordID: "a4", MissingFrom: 3, MissingTo: 3, Checked: 3}},
		{"last record replaced by one rehashed", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			r[4] = forge(r[4], true)
			return r, h
		}, ChainReport{Problem: ChainRemoved, Seq: 5, RecordID: "forged", MissingFrom: 5, MissingTo: 5, Checked: 4}},
		{"two records swapped in place", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			r[1], r[2] = r[2], r[1]
			return r, h
		}, ChainReport{Problem: ChainInserted, Seq: 3, RecordID: "a3", Checked: 1}},
		{"two records' contents swapped under their seqs", func(r []AuditRecord, h AuditHead) ([]AuditRecord, AuditHead) {
			a, b := r[1], r[2]
			a.Seq, a.PrevHash, a.Hash, b.Seq, b.PrevHash, b.Hash = b.Seq, b.PrevHash, b.Hash, a.Seq, a.PrevHash, a.Hash
			r[1], r[2] = b, a
			return r, h
		}, ChainReport{Problem: ChainAltered, Seq: 2, RecordID: "a3", Checked: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, head := testChain(5)
			recs, head = tt.edit(recs, head)
			got := VerifyAuditChain(head, recs)
			got.Detail, got.Last = "", AuditHead{}
			if got != tt.want {
				t.Errorf("VerifyAuditChain\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func insert(rs []AuditRecord, at int, r AuditRecord) []AuditRecord {
	out := append([]AuditRecord{}, rs[:at]...)
	out = append(out, r)
	return append(out, rs[at:]...)
}

// Each tampering of a chain whose start is pinned (one legacy record before it) fails
// verification: VerifyAuditChain on the head read before the records, then ConfirmHead on
// the head read after them, as capacityctl audit verify runs them. The untampered cases pass.
func TestVerifyTamperings(t *testing.T) {
	legacy := AuditRecord{ID: "old", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), NodeID: "n1", Action: ActionRelease}
	type state struct {
		recs          []AuditRecord
		before, after AuditHead // the head read before the records, and after them
	}
	tests := []struct {
		name    string
		tamper  func(s *state)
		problem string // "" = verifies
		seq     int64
	}{
		{"untouched", func(s *state) {}, "", 0},
		{"records appended while verifying", func(s *state) {
			s.before = AuditHead{Seq: 3, Hash: s.recs[3].Hash, Start: s.before.Start}
		}, "", 0},
		{"head rolled back", func(s *state) {
			s.before = AuditHead{Seq: 3, Hash: s.recs[3].Hash, Start: s.before.Start}
			s.after = s.before
		}, ChainBeyondHead, 4},
		{"head rolled back, the last record rewritten and rehashed", func(s *state) {
			s.recs[5].Reason = "nothing happened"
			s.recs[5].Hash = HashAuditRecord(s.recs[5])
			s.before = AuditHead{Seq: 3, Hash: s.recs[3].Hash, Start: s.before.Start}
			s.after = s.before
		}, ChainBeyondHead, 4},
		{"a record past the head rewritten and rehashed, the head read after naming the original", func(s *state) {
			s.recs[5].Reason = "nothing happened"
			s.recs[5].Hash = HashAuditRecord(s.recs[5])
			s.before = AuditHead{Seq: 3, Hash: s.recs[3].Hash, Start: s.before.Start}
		}, ChainBeyondHead, 4},
		{"head rolled back, a record past it rewritten", func(s *state) {
			s.recs[5].Reason = "nothing happened"
			s.before = AuditHead{Seq: 3, Hash: s.recs[3].Hash, Start: s.before.Start}
			s.after = s.before
		}, ChainAltered, 5},
		{"back-dated unchained record planted", func(s *state) {
			planted := legacy
			planted.ID, planted.Time, planted.Reason = "planted", legacy.Time.Add(-time.Hour), "approved by ops"
			s.recs = append([]AuditRecord{planted}, s.recs...)
		}, ChainInserted, 0},
		{"unchained record planted just before the chain", func(s *state) {
			planted := legacy
			planted.ID, planted.Time = "planted", s.recs[1].Time.Add(-time.Nanosecond)
			s.recs = insert(s.recs, 1, planted)
		}, ChainInserted, 0},
		{"legacy record rewritten", func(s *state) {
			s.recs[0].Reason = "rewritten"
		}, ChainAltered, 0},
		{"legacy record removed", func(s *state) {
			s.recs = s.recs[1:]
		}, ChainRemoved, 0},
		{"the head's start pin removed", func(s *state) {
			s.before.Start, s.after.Start = ChainStart{}, ChainStart{}
		}, ChainRemoved, 1},
		{"record planted and the head's pin rewritten to cover it", func(s *state) {
			planted := legacy
			planted.ID, planted.Time = "planted", legacy.Time.Add(-time.Hour)
			s.recs = append([]AuditRecord{planted}, s.recs...)
			s.before.Start = ChainStartOf(s.recs[:2])
			s.after = s.before
		}, ChainAltered, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Five records after one legacy record; the first record's append pinned the start.
			pin := ChainStartOf([]AuditRecord{legacy})
			var head AuditHead
			var chain []AuditRecord
			for i, r := range func() []AuditRecord { c, _ := testChain(5); return c }() {
				r.Seq, r.PrevHash, r.Hash, r.Start = 0, "", "", nil
				if i == 0 {
					r.Start = &pin
				}
				r, head = ChainAuditRecord(r, head)
				chain = append(chain, r)
			}
			head.Start = pin
			s := &state{recs: append([]AuditRecord{legacy}, chain...), before: head, after: head}
			tt.tamper(s)
			rep := ConfirmHead(VerifyAuditChain(s.before, s.recs), s.after)
			if tt.problem == "" {
				if !rep.OK || !rep.Pinned || rep.Unchained != 1 {
					t.Fatalf("report %+v, want OK with the one pinned legacy record", rep)
				}
				return
			}
			if rep.OK || rep.Problem != tt.problem || rep.Seq != tt.seq {
				t.Fatalf("report %+v, want problem %s at seq %d", rep, tt.problem, tt.seq)
			}
		})
	}
}

// A chain whose head pins no start (begun before pins, and not appended to since) passes
// with its unchained records reported as not pinned.
func TestVerifyUnpinnedStart(t *testing.T) {
	chain, head := testChain(2)
	legacy := AuditRecord{ID: "old", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	rep := VerifyAuditChain(head, append([]AuditRecord{legacy}, chain...))
	if !rep.OK || rep.Pinned || rep.Unchained != 1 {
		t.Fatalf("report %+v, want OK, 1 unchained, not pinned", rep)
	}
	if (ChainStart{}).Pinned() || !ChainStartOf(nil).Pinned() {
		t.Error("the zero start is pinned, or the start of no records is not")
	}
}

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
