package capacity

import (
	"encoding/base64"
	"encoding/json"
)

// The cursors of the reservation and key lists name the last item the caller was shown, and
// nothing else: the next page starts after it, and the caller's access is checked again on
// every page. So a cursor needs no secret and leaks nothing: what it says, the caller was
// shown, and a cursor made up to name any other item only moves where a page starts among
// the items the caller may see. Storage keys (a key's hash, the id of a reservation the caller
// may not see) never reach a cursor. A cursor is opaque: base64url of a versioned JSON list.

// listCursor is the cursor of a list of kind positioned after the item named by parts.
func listCursor(kind string, parts ...string) string {
	b, _ := json.Marshal(append([]string{"v1", kind}, parts...))
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseCursor returns the parts of a cursor that listCursor(kind, n parts) made; nil for ""
// (the first page). Anything else is an *Error invalid_request "invalid cursor".
func parseCursor(c, kind string, n int) ([]string, error) {
	if c == "" {
		return nil, nil
	}
	invalid := Errorf(CodeInvalidRequest, "invalid cursor")
	if len(c) > 1024 {
		return nil, invalid
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, invalid
	}
	var parts []string
	if json.Unmarshal(b, &parts) != nil || len(parts) != n+2 || parts[0] != "v1" || parts[1] != kind {
		return nil, invalid
	}
	for _, p := range parts[2:] {
		if p == "" || len(p) > MaxIDLen {
			return nil, invalid
		}
	}
	return parts[2:], nil
}
