package dynamo

import (
	"encoding/base64"
	"errors"
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

func TestCursorRoundTrip(t *testing.T) {
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	tests := []struct {
		name   string
		lek    map[string]types.AttributeValue
		wantPK string
	}{
		{"table key", map[string]types.AttributeValue{"pk": s("NODE#n1"), "sk": s("RES#r1")}, "NODE#n1"},
		{"index key, no partition check", map[string]types.AttributeValue{"pk": s("NODE#n1"), "sk": s("SEQ#1"), "resKey": s("NODE#n1#RES#r1")}, ""},
		{"scan key", map[string]types.AttributeValue{"pk": s("APIKEY#abc"), "sk": s("APIKEY")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := encodeCursor(tt.lek)
			if err != nil {
				t.Fatal(err)
			}
			if c == "" {
				t.Fatal("empty cursor for a key")
			}
			got, err := decodeCursor(c, tt.wantPK)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.lek) {
				t.Fatalf("round trip: got %v, want %v", got, tt.lek)
			}
		})
	}
}

func TestCursorEmpty(t *testing.T) {
	c, err := encodeCursor(nil)
	if err != nil || c != "" {
		t.Fatalf("encodeCursor(nil) = %q, %v; want \"\", nil", c, err)
	}
	lek, err := decodeCursor("", "NODE#n1")
	if err != nil || lek != nil {
		t.Fatalf("decodeCursor(\"\") = %v, %v; want nil, nil", lek, err)
	}
}

func TestCursorEncodeRefusesNonString(t *testing.T) {
	_, err := encodeCursor(map[string]types.AttributeValue{"pk": &types.AttributeValueMemberN{Value: "1"}})
	if err == nil {
		t.Fatal("want an error for a number attribute")
	}
}

func TestCursorDecodeInvalid(t *testing.T) {
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	other, err := encodeCursor(map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "NODE#n2"}, "sk": &types.AttributeValueMemberS{Value: "RES#a"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, cursor, wantPK string
	}{
		{"not base64", "!!!", ""},
		{"padded base64", base64.URLEncoding.EncodeToString([]byte(`{"pk":"NODE#n1"}`)) + "=", ""},
		{"not json", b64("hello"), ""},
		{"empty object", b64(`{}`), ""},
		{"number value", b64(`{"pk":1}`), ""},
		{"empty value", b64(`{"pk":""}`), ""},
		{"another partition", other, "NODE#n1"},
		{"no partition", b64(`{"sk":"RES#a"}`), "NODE#n1"},
		{"too long", string(make([]byte, 5000)), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeCursor(tt.cursor, tt.wantPK)
			var ce *capacity.Error
			if !errors.As(err, &ce) || ce.Code != capacity.CodeInvalidRequest || ce.Message != "invalid cursor" {
				t.Fatalf("decodeCursor(%q) error = %v; want invalid_request \"invalid cursor\"", tt.cursor, err)
			}
		})
	}
}
