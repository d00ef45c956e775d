package capacity

import (
	"strings"
	"testing"
	"time"
)

// Every free-text member refuses characters that change how the text around them is shown:
// a reason with a newline forges a line of a log or a table, ESC starts a terminal sequence,
// U+202E reverses what follows on screen. Printable text, non-ASCII included, is kept.
func TestFreeTextRefusesControlCharacters(t *testing.T) {
	later := now.Add(time.Hour)
	fields := []struct {
		name     string
		validate func(text string) error
	}{
		{"reclaim reason", func(s string) error {
			return CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, Reason: s}.Validate()
		}},
		{"reservation change reason", func(s string) error {
			return ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: s}.Validate()
		}},
		{"topology reason", func(s string) error {
			return TopologyRequest{NodeID: "n1", UnitIDs: []string{"u1"}, Reason: s}.Validate()
		}},
		{"node reason", func(s string) error {
			return NodeRequest{NodeID: "n1", OwnerOrgID: "o", UnitIDs: []string{"u1"}, AgentEndpoint: "https://agent", Reason: s}.Validate(false)
		}},
		{"node agent endpoint", func(s string) error {
			return NodeRequest{NodeID: "n1", OwnerOrgID: "o", UnitIDs: []string{"u1"}, AgentEndpoint: "https://agent/" + s}.Validate(false)
		}},
		{"reservation contractRef", func(s string) error {
			return ReservationRequest{NodeID: "n1", StartsAt: now, EndsAt: &later, ReservedUnitIDs: []string{"u1"}, ContractRef: s}.Validate(now)
		}},
		{"reservation reason", func(s string) error {
			return ReservationRequest{NodeID: "n1", StartsAt: now, EndsAt: &later, ReservedUnitIDs: []string{"u1"}, Reason: s}.Validate(now)
		}},
		{"key description", func(s string) error {
			_, err := KeyRequest{OrgID: "o", Permissions: []string{PermRead}, Description: s}.validate(now)
			return err
		}},
	}
	texts := []struct {
		name, text string
		refused    bool
	}{
		{"plain", "training run 7", false},
		{"non-ASCII letters", "Übernahme für Läufe", false},
		{"newline", "ok\n2026-12-01 forged line", true},
		{"carriage return", "ok\rforged", true},
		{"tab", "a\tb", true},
		{"ESC sequence", "\x1b[2J\x1b[31mred", true},
		{"NUL", "a\x00b", true},
		{"DEL", "a\x7fb", true},
		{"C1 CSI", "a\u009b31mb", true},
		{"C1 NEL", "a\u0085b", true},
		{"right-to-left override", "ok \u202eevil", true},
		{"bidi isolate", "ok \u2066evil\u2069", true},
		{"line separator", "a\u2028b", true},
	}
	for _, f := range fields {
		for _, tt := range texts {
			t.Run(f.name+"/"+tt.name, func(t *testing.T) {
				err := f.validate(tt.text)
				if !tt.refused {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					return
				}
				if ErrorCode(err) != CodeInvalidRequest {
					t.Fatalf("got %v, want invalid_request", err)
				}
				if f.name != "node agent endpoint" && !strings.Contains(ErrorMessage(err), "control characters") {
					t.Errorf("message %q does not say why", ErrorMessage(err))
				}
			})
		}
	}
}
