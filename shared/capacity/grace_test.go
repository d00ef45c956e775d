package capacity

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestGraceSecondsValidation(t *testing.T) {
	tests := []struct {
		name   string
		action string
		grace  int
		ok     bool
	}{
		{"reclaim without grace", ActionReclaim, 0, true},
		{"reclaim with grace", ActionReclaim, 45, true},
		{"reclaim at the bound", ActionReclaim, MaxGraceSeconds, true},
		{"reclaim over the bound", ActionReclaim, MaxGraceSeconds + 1, false},
		{"reclaim negative", ActionReclaim, -1, false},
		{"release without grace", ActionRelease, 0, true},
		{"release with grace", ActionRelease, 5, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, GraceSeconds: tt.grace}
			err := req.Validate()
			if err == nil {
				err = req.validateFor(tt.action)
			}
			if tt.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %v", err, tt.ok)
			}
			if err != nil && (ErrorCode(err) != CodeInvalidRequest || !strings.Contains(ErrorMessage(err), "graceSeconds")) {
				t.Errorf("err = %v, want invalid_request naming graceSeconds", err)
			}
		})
	}
}

// The commit records when termination may begin, the owner, and each victim's buyer and
// units as read; the answer carries terminateAfter only when something was evicted.
func TestCommitRecordsGraceOwnerAndVictims(t *testing.T) {
	tests := []struct {
		name      string
		units     []string
		grace     int
		dryRun    bool
		wantAfter time.Time // zero: no operation
		victims   []Victim
	}{
		{"grace", []string{"u2", "u3"}, 90, false, now.Add(90 * time.Second),
			[]Victim{{VMID: "vm-spot-a", OrgID: "x", UnitIDs: []string{"u2"}}, {VMID: "vm-spot-b", OrgID: "y", UnitIDs: []string{"u3", "u6"}}}},
		{"no grace", []string{"u2"}, 0, false, now, []Victim{{VMID: "vm-spot-a", OrgID: "x", UnitIDs: []string{"u2"}}}},
		{"nothing evicted", []string{"u1"}, 60, false, time.Time{}, nil},
		{"dry run", []string{"u2"}, 60, true, time.Time{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: tt.units, GraceSeconds: tt.grace, DryRun: tt.dryRun}
			plan, err := DecideReclaim(principal("owner", false, PermCapacity), fixture(), req, now)
			if err != nil {
				t.Fatal(err)
			}
			c, res, _ := plan.Commit("rcl_1", AuditRecord{ID: "a1"}, now)
			if !res.TerminateAfter.Equal(tt.wantAfter) {
				t.Errorf("result terminateAfter = %v, want %v", res.TerminateAfter, tt.wantAfter)
			}
			if tt.wantAfter.IsZero() {
				if c != nil && c.Operation != nil {
					t.Fatalf("operation %+v, want none", c.Operation)
				}
				return
			}
			op := c.Operation
			if !op.TerminateAfter.Equal(tt.wantAfter) || op.OwnerOrgID != "owner" || !reflect.DeepEqual(op.Victims, tt.victims) {
				t.Errorf("operation terminateAfter %v owner %q victims %+v", op.TerminateAfter, op.OwnerOrgID, op.Victims)
			}
		})
	}
}

// The idempotency fingerprint covers the grace: the same key with another grace is another
// request. Without grace the fingerprint is what it was before grace existed, so stored
// records of earlier requests still replay.
func TestFingerprintCoversGrace(t *testing.T) {
	req := CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}}
	withGrace := req
	withGrace.GraceSeconds = 30
	if fingerprintOf(ActionReclaim, req) == fingerprintOf(ActionReclaim, withGrace) {
		t.Error("grace does not change the fingerprint")
	}
	type before struct { // CapacityRequest as it was
		NodeID, ReservationID string
		UnitIDs               []string
		DryRun                bool
		Reason                string
		IdempotencyKey        string
	}
	if fingerprintOf(ActionReclaim, req) != fingerprintOf(ActionReclaim, before{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}}) {
		t.Error("a request without grace has a new fingerprint: stored idempotency records would no longer replay")
	}
}
