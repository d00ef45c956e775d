package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// MaxBodyBytes bounds a request body. The largest valid body (64 unit ids and a reason) is
// a few KiB.
const MaxBodyBytes = 64 << 10

// CapacityBody is the body of a reclaim or release.
type CapacityBody struct {
	UnitIDs []string `json:"unitIds"`
	DryRun  bool     `json:"dryRun"`
	Reason  string   `json:"reason"`
	// GraceSeconds delays the evicted VMs' termination (reclaim only).
	GraceSeconds int `json:"graceSeconds"`
	// At (reclaim only, RFC 3339) schedules the reclaim for that time instead of running it.
	At *string `json:"at"`
}

// ReclaimPlanBody is the body of a reclaim plan: a count in place of the units.
type ReclaimPlanBody struct {
	Count        int    `json:"count"`
	Reason       string `json:"reason"`
	GraceSeconds int    `json:"graceSeconds"`
}

// PlacementBody is the body of a VM placement.
type PlacementBody struct {
	VMID    string   `json:"vmId"`
	OrgID   string   `json:"orgId"`
	Tier    string   `json:"tier"`
	UnitIDs []string `json:"unitIds"`
}

// DecodeJSON reads one JSON object into v, strictly: JSON content type, at most
// MaxBodyBytes, no unknown fields (a typo such as "dryrun" must never run a real reclaim),
// matching types, nothing after the object.
func DecodeJSON(contentType string, body io.Reader, v any) error {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return capacity.Errorf(CodeUnsupportedMediaType, "the body must be JSON: Content-Type: application/json")
	}
	data, err := io.ReadAll(io.LimitReader(body, MaxBodyBytes+1))
	if err != nil {
		return capacity.Errorf(CodeMalformedRequest, "the body could not be read")
	}
	if len(data) > MaxBodyBytes {
		return capacity.Errorf(CodeBodyTooLarge, "the body is larger than %d bytes", MaxBodyBytes)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return capacity.Errorf(CodeMalformedRequest, "%s", describeJSONError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return capacity.Errorf(CodeMalformedRequest, "the body must hold exactly one JSON object")
	}
	return checkMemberNames(data, v)
}

// checkMemberNames refuses a body that is not a JSON object, whose member names are not
// exactly (case-sensitively) the JSON names of v's fields, each at most once, or that holds a
// null anywhere. encoding/json matches names case-insensitively, even with Unicode folding,
// so DisallowUnknownFields alone lets "dryrun", "DRYRUN" or "dryRun" spelt with a Kelvin sign
// set dryRun; of duplicate names it silently keeps the last; and it decodes null as the zero
// value. data is known to be valid JSON here.
func checkMemberNames(data []byte, v any) error {
	known := wire.MemberNames(v)
	if known == nil {
		return nil // not a struct: nothing to match names against
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return capacity.Errorf(CodeMalformedRequest, "the body must be a JSON object")
	}
	seen := make(map[string]bool, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return capacity.Errorf(CodeMalformedRequest, "malformed JSON")
		}
		name, _ := tok.(string)
		if !known[name] {
			return capacity.Errorf(CodeMalformedRequest, "unknown field %q", name)
		}
		if seen[name] {
			return capacity.Errorf(CodeMalformedRequest, "field %q appears more than once", name)
		}
		seen[name] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return capacity.Errorf(CodeMalformedRequest, "malformed JSON")
		}
		// encoding/json leaves a field at its zero value for null: "dryRun":null would run a
		// real reclaim. A null is never a default, here or inside a value.
		if wire.HasNull(value) {
			return capacity.Errorf(CodeMalformedRequest, "field %q must not be null or hold null; leave it out instead", name)
		}
	}
	return nil
}

func describeJSONError(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("malformed JSON at byte %d", syntax.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return "the body must be a JSON object"
		}
		return fmt.Sprintf("field %q must be %s", typ.Field, jsonKind(typ.Type.Kind().String()))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the body is empty or truncated"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return "malformed JSON"
}

func jsonKind(goKind string) string {
	switch goKind {
	case "slice":
		return "an array of strings"
	case "bool":
		return "a boolean"
	case "string":
		return "a string"
	case "int":
		return "an integer"
	}
	return "of another type"
}
