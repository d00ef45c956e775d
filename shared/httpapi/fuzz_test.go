package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// FuzzDecodeCapacityBody feeds arbitrary content types and bodies through the strict decoder
// and the request's own validation, as the reclaim and release handlers do. Seeds live in
// testdata/fuzz/FuzzDecodeCapacityBody.
func FuzzDecodeCapacityBody(f *testing.F) {
	f.Add("application/json", []byte(`{"unitIds":["u1"],"dryRun":true,"reason":"r"}`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var got CapacityBody
		decErr := DecodeJSON(contentType, bytes.NewReader(body), &got)
		err := decErr
		if err == nil {
			req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1",
				UnitIDs: got.UnitIDs, DryRun: got.DryRun, Reason: got.Reason}
			err = req.Validate()
		}

		// Every refusal is an application error the caller can act on: a 4xx.
		if err != nil {
			var e *capacity.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not a *capacity.Error", err, err)
			}
			if s := StatusOf(e.Code); s < 400 || s > 499 {
				t.Fatalf("code %q maps to %d, want a 4xx (err: %v)", e.Code, s, err)
			}
			if e.Message == "" {
				t.Fatalf("code %q has an empty message", e.Code)
			}
		}

		// A body naming any member other than exactly the documented ones is refused.
		if name, ok := unknownTopLevelKey(body); ok && decErr == nil {
			t.Fatalf("body with unknown member %q decoded to %+v", name, got)
		}

		// A null is never a default: a body holding one anywhere is refused.
		if decErr == nil && holdsNull(body) {
			t.Fatalf("body with a null decoded to %+v", got)
		}

		if decErr != nil {
			return
		}
		// What decoded re-encodes to a body that decodes to the same value. An absent
		// unitIds stays absent: null is refused.
		members := map[string]any{"dryRun": got.DryRun, "reason": got.Reason}
		if got.UnitIDs != nil {
			members["unitIds"] = got.UnitIDs
		}
		enc, err := json.Marshal(members)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", got, err)
		}
		var again CapacityBody
		err = DecodeJSON("application/json", bytes.NewReader(enc), &again)
		if len(enc) > MaxBodyBytes {
			// Escaping can grow a body (e.g. U+2028 or '<' become \uXXXX): then the size
			// limit, and nothing else, refuses it.
			if capacity.ErrorCode(err) != CodeBodyTooLarge {
				t.Fatalf("re-encoded body of %d bytes: err %v, want %s", len(enc), err, CodeBodyTooLarge)
			}
			return
		}
		if err != nil {
			t.Fatalf("re-encoded body %s does not decode: %v", enc, err)
		}
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("round trip changed the body:\n got   %#v\n again %#v", got, again)
		}
	})
}

// unknownTopLevelKey reports a member name of body, if body is a JSON object, that is not
// exactly one of CapacityBody's.
func unknownTopLevelKey(body []byte) (string, bool) {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return "", false
	}
	for name := range members {
		switch name {
		case "unitIds", "dryRun", "reason":
		default:
			return name, true
		}
	}
	return "", false
}

// holdsNull reports whether body is valid JSON with a null anywhere in it.
func holdsNull(body []byte) bool {
	if !json.Valid(body) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if tok == nil {
			return true
		}
	}
}
