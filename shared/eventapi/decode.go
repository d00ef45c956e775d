package eventapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// RequestDetail is the detail of a Capacity Reclaim Requested event from a tenant or the
// platform's scheduler.
type RequestDetail struct {
	NodeID         string   `json:"nodeId"`
	ReservationID  string   `json:"reservationId"`
	UnitIDs        []string `json:"unitIds"`
	ActingOrgID    string   `json:"actingOrgId"`
	Reason         string   `json:"reason"`
	DryRun         bool     `json:"dryRun"`
	IdempotencyKey string   `json:"idempotencyKey"`
	GraceSeconds   int      `json:"graceSeconds"`
}

// requestRequired are the members a request detail must hold.
var requestRequired = []string{"nodeId", "reservationId", "unitIds", "actingOrgId"}

// ScheduleDetail is the detail of a Capacity Reclaim Requested event put by a scheduled
// reclaim's schedule: everything else comes from the stored scheduled reclaim.
type ScheduleDetail struct {
	NodeID             string `json:"nodeId"`
	ReservationID      string `json:"reservationId"`
	ScheduledReclaimID string `json:"scheduledReclaimId"`
}

var scheduleRequired = []string{"nodeId", "reservationId", "scheduledReclaimId"}

// MaxDetailBytes bounds a detail (EventBridge's own bound is 256 KB for the whole event);
// the largest valid request detail is a few KiB.
const MaxDetailBytes = 64 << 10

// decodeDetail reads a detail into v strictly: one JSON object whose member names are
// exactly (case-sensitively) v's, each at most once, without null anywhere, with matching
// types, holding every required member. A typo such as "dryrun" must never run a real
// reclaim, and a null must never stand for a default. Every failure is invalid_request.
func decodeDetail(data []byte, v any, required []string) error {
	if len(data) > MaxDetailBytes {
		return capacity.Errorf(capacity.CodeInvalidRequest, "the detail is larger than %d bytes", MaxDetailBytes)
	}
	members, err := checkMembers(data, wire.MemberNames(v))
	if err != nil {
		return err
	}
	for _, name := range required {
		if !members[name] {
			return capacity.Errorf(capacity.CodeInvalidRequest, "detail member %q is required", name)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return capacity.Errorf(capacity.CodeInvalidRequest, "%s", describe(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return capacity.Errorf(capacity.CodeInvalidRequest, "the detail must hold exactly one JSON object")
	}
	return nil
}

// checkMembers returns the member names of the JSON object data, refusing anything but an
// object, names not in known (encoding/json would match them case-insensitively), duplicates
// (it would keep the last) and nulls (it would decode them as the zero value).
func checkMembers(data []byte, known map[string]bool) (map[string]bool, error) {
	if !json.Valid(data) {
		return nil, capacity.Errorf(capacity.CodeInvalidRequest, "the detail is not valid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, capacity.Errorf(capacity.CodeInvalidRequest, "the detail must be a JSON object")
	}
	seen := make(map[string]bool, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, capacity.Errorf(capacity.CodeInvalidRequest, "the detail is not valid JSON")
		}
		name, _ := tok.(string)
		if !known[name] {
			return nil, capacity.Errorf(capacity.CodeInvalidRequest, "unknown detail member %q", name)
		}
		if seen[name] {
			return nil, capacity.Errorf(capacity.CodeInvalidRequest, "detail member %q appears more than once", name)
		}
		seen[name] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, capacity.Errorf(capacity.CodeInvalidRequest, "the detail is not valid JSON")
		}
		if wire.HasNull(value) {
			return nil, capacity.Errorf(capacity.CodeInvalidRequest, "detail member %q must not be null or hold null; leave it out instead", name)
		}
	}
	return seen, nil
}

func describe(err error) string {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) && typ.Field != "" {
		kind := "of another type"
		switch typ.Type.Kind() {
		case reflect.Slice:
			kind = "an array of strings"
		case reflect.Bool:
			kind = "a boolean"
		case reflect.String:
			kind = "a string"
		case reflect.Int:
			kind = "an integer"
		}
		return fmt.Sprintf("detail member %q must be %s", typ.Field, kind)
	}
	return "the detail is malformed"
}
