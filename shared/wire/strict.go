package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
)

// The strict decoders of the HTTP API and of the inbound events refuse the same things with
// these: a member the body type does not name, and null anywhere.

// HasNull reports whether a valid JSON value is or contains null.
func HasNull(value json.RawMessage) bool {
	dec := json.NewDecoder(bytes.NewReader(value))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false // io.EOF: the value is known to be valid JSON
		}
		if tok == nil {
			return true
		}
	}
}

// MemberNames returns the JSON member names of the struct v points to, or nil.
func MemberNames(v any) map[string]bool {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	names := make(map[string]bool, t.NumField())
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}
