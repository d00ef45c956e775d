package capacity

import (
	"regexp"
	"slices"
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
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// validID reports whether s is a well-formed identifier.
func validID(s string) bool { return len(s) <= MaxIDLen && idPattern.MatchString(s) }

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
		case !validID(id):
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
	return nil
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
}

// Validate checks the request on its own, before anything is read.
func (r CapacityRequest) Validate() error {
	if !validID(r.NodeID) || !validID(r.ReservationID) {
		return notFound() // a malformed id names nothing that exists
	}
	if err := validateUnitIDs(r.UnitIDs); err != nil {
		return err
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
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
	if !validID(r.VMID) {
		return Errorf(CodeInvalidRequest, "vmId is required: letters, digits, '.', '_', ':' or '-', at most %d", MaxIDLen)
	}
	if !validID(r.OrgID) {
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
