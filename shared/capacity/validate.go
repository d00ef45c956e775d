package capacity

import (
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on requests. MaxUnits also bounds the transaction: 64 units under 64 different VMs
// plus the node, reservation, operation, audit and idempotency items stay far below
// DynamoDB's 100 actions per TransactWriteItems.
const (
	MaxUnits     = 64
	MaxReasonLen = 1024
	MaxIDLen     = 128
	MaxKeyLen    = 255
	// MaxGraceSeconds bounds a reclaim's grace: the units are exclusive at commit, but the
	// evicted VMs are terminated only after it.
	MaxGraceSeconds = 120
)

// idPattern is the one shape of every identifier: node, reservation, reclaim operation, VM,
// unit and org ids. It starts with a letter or digit, so "." and ".." never match, and it
// stays far below DynamoDB's 1 KB sort-key limit once prefixed.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// ValidID reports whether s is a well-formed identifier: 1..MaxIDLen characters of
// [A-Za-z0-9._:-], starting with a letter or digit. Every id taken from a path or a body is
// checked with it before anything is read, so a malformed one never reaches the store.
func ValidID(s string) bool { return len(s) <= MaxIDLen && idPattern.MatchString(s) }

// AdmitCapacityCall checks what a reclaim or release is refused on before its body is read:
// the caller's permission and the path ids. Each refusal is the one 404 of a reservation that
// does not exist, so neither the body, its content type nor its size can tell a caller without
// the permission anything.
func AdmitCapacityCall(p Principal, nodeID, reservationID string) error {
	if !p.Can(PermCapacity) || !ValidID(nodeID) || !ValidID(reservationID) {
		return notFound()
	}
	return nil
}

// AdmitPlacement is AdmitCapacityCall for a placement: only an operator with vm.place may
// place, on a well-formed node id.
func AdmitPlacement(p Principal, nodeID string) error {
	if !p.Operator || !p.Can(PermPlace) || !ValidID(nodeID) {
		return nodeNotFound()
	}
	return nil
}

// validateUnitIDs checks a request's unit list: 1..MaxUnits unique, well-formed ids.
func validateUnitIDs(ids []string) error {
	if len(ids) == 0 {
		return Errorf(CodeInvalidRequest, "unitIds is required and must name at least one unit")
	}
	if len(ids) > MaxUnits {
		return Errorf(CodeInvalidRequest, "unitIds names %d units; at most %d per call", len(ids), MaxUnits)
	}
	seen := make(map[string]bool, len(ids))
	var bad, dup []string
	for _, id := range ids {
		switch {
		case !ValidID(id):
			bad = append(bad, id)
		case seen[id]:
			dup = append(dup, id)
		}
		seen[id] = true
	}
	if len(bad) > 0 {
		return &Error{Code: CodeInvalidRequest, Message: "unitIds holds malformed unit ids", UnitIDs: bad}
	}
	if len(dup) > 0 {
		return &Error{Code: CodeInvalidRequest, Message: "unitIds names a unit more than once", UnitIDs: dup}
	}
	return nil
}

func validateReason(reason string) error {
	if !utf8.ValidString(reason) || len(reason) > MaxReasonLen {
		return Errorf(CodeInvalidRequest, "reason must be valid UTF-8 of at most %d bytes", MaxReasonLen)
	}
	return validateText("reason", reason)
}

// validateText refuses free text (reasons, descriptions, contract references) that holds a
// character which changes how text around it is shown rather than being shown itself: C0 and
// C1 controls (newlines forge log and table lines, ESC starts terminal sequences), the
// bidirectional overrides and isolates ("Trojan Source") and the line and paragraph
// separators. Such text is stored, audited and printed to operators' terminals.
func validateText(member, s string) error {
	if strings.ContainsFunc(s, UnsafeRune) {
		return Errorf(CodeInvalidRequest, "%s must not hold control characters (C0/C1 controls, bidirectional controls, line separators)", member)
	}
	return nil
}

// UnsafeRune reports whether r is a character validateText refuses (and capacityctl escapes
// when it prints).
func UnsafeRune(r rune) bool {
	switch {
	case unicode.IsControl(r):
		return true
	case r == 0x061C, r == 0x200E, r == 0x200F, r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
		return true // bidirectional marks, embeddings, overrides and isolates
	case r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// ValidateIdempotencyKey checks an Idempotency-Key header value ("" means none was sent).
func ValidateIdempotencyKey(key string) error {
	if len(key) > MaxKeyLen {
		return Errorf(CodeInvalidRequest, "Idempotency-Key is longer than %d characters", MaxKeyLen)
	}
	for _, r := range key {
		if r < 0x21 || r > 0x7e {
			return Errorf(CodeInvalidRequest, "Idempotency-Key must be printable ASCII without spaces")
		}
	}
	return nil
}

// CapacityRequest is a reclaim or release of units of one reservation.
type CapacityRequest struct {
	NodeID         string
	ReservationID  string
	UnitIDs        []string
	DryRun         bool
	Reason         string
	IdempotencyKey string
	// GraceSeconds delays the evicted VMs' termination (reclaim only, 0..MaxGraceSeconds).
	// omitempty keeps the idempotency fingerprint of a request without grace what it was
	// before grace existed.
	GraceSeconds int `json:",omitempty"`
	// IfMatch is the raw If-Match header of a reclaim: it runs only if its plan's ETag is
	// among these ("" = no condition). Not part of the idempotency fingerprint: a replay
	// answers the stored result whatever it says.
	IfMatch string `json:"-"`
}

// Validate checks the request on its own, before anything is read.
func (r CapacityRequest) Validate() error {
	if !ValidID(r.NodeID) || !ValidID(r.ReservationID) {
		return notFound() // a malformed id names nothing that exists
	}
	if err := validateUnitIDs(r.UnitIDs); err != nil {
		return err
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	if err := validateGrace(r.GraceSeconds); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

func validateGrace(seconds int) error {
	if seconds < 0 || seconds > MaxGraceSeconds {
		return Errorf(CodeInvalidRequest, "graceSeconds must be 0 to %d", MaxGraceSeconds)
	}
	return nil
}

// admitFor checks a capacity call before anything is read: the caller's gate first (a caller
// without the permission learns nothing, not even whether its input was valid), then the
// request on its own and for the action.
func (r CapacityRequest) admitFor(p Principal, action string) error {
	if err := AdmitCapacityCall(p, r.NodeID, r.ReservationID); err != nil {
		return err
	}
	if err := r.Validate(); err != nil {
		return err
	}
	return r.validateFor(action)
}

// validateFor checks what depends on the action: grace delays terminations, which only a
// reclaim has.
func (r CapacityRequest) validateFor(action string) error {
	if action == ActionRelease && r.GraceSeconds != 0 {
		return Errorf(CodeInvalidRequest, "graceSeconds applies to a reclaim only; a release terminates nothing")
	}
	if action == ActionRelease && r.IfMatch != "" {
		return Errorf(CodeInvalidRequest, "If-Match applies to a reclaim only; a release has no plan")
	}
	return nil
}

// PlacementRequest is the marketplace scheduler placing a VM on units of a node.
type PlacementRequest struct {
	NodeID         string
	VMID           string
	OrgID          string
	Tier           Tier
	UnitIDs        []string
	IdempotencyKey string
}

// Validate checks the request on its own, before anything is read.
func (r PlacementRequest) Validate() error {
	if !ValidID(r.VMID) {
		return Errorf(CodeInvalidRequest, "vmId is required: letters, digits, '.', '_', ':' or '-', at most %d", MaxIDLen)
	}
	if !ValidID(r.OrgID) {
		return Errorf(CodeInvalidRequest, "orgId is required: letters, digits, '.', '_', ':' or '-', at most %d", MaxIDLen)
	}
	if !slices.Contains([]Tier{TierSpot, TierReserved, TierOnDemand}, r.Tier) {
		return Errorf(CodeInvalidRequest, "tier must be one of spot, reserved, on-demand")
	}
	if err := validateUnitIDs(r.UnitIDs); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}
