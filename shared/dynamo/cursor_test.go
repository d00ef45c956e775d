package dynamo

import (
	"encoding/base64"
	"errors"
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

func TestCursorRoundTrip(t *testing.T) {
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	tests := []struct {
		name  string
		lek   map[string]types.AttributeValue
		shape keyShape
	}{
		{"chained record", map[string]types.AttributeValue{"pk": s("NODE#n1"), "sk": s(seqSK(7))}, chainShape("NODE#n1")},
		{"unchained record", map[string]types.AttributeValue{"pk": s("NODE#n1"), "sk": s("2026-01-02T03:04:05.123Z#rec1")}, chainShape("NODE#n1")},
		{"index entry", map[string]types.AttributeValue{"pk": s("NODE#n1"), "sk": s(seqSK(1)), table.AuditByReservationKey: s("NODE#n1#RES#r1")},
			reservationAuditShape("n1", "r1", capacity.ChainChanges)},
		{"scheduled reclaim", map[string]types.AttributeValue{"pk": s("NODE#n1#SCHED#s1"), "sk": s("SCHED"), "gsi1pk": s("NODE#n1#RES#r1#SCHED"), "gsi1sk": s("2026-01-02T03:04:05Z#s1")},
			schedCursorShape("n1", "r1")},
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
			got, err := decodeCursor(c, tt.shape)
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
	lek, err := decodeCursor("", chainShape("NODE#n1"))
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

// Every cursor that is not a key this list hands out is refused before it reaches DynamoDB,
// which would answer a start key off the query's schema or partition with a
// ValidationException (a 500).
func TestCursorDecodeInvalid(t *testing.T) {
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	chain, res, sched := chainShape("NODE#n1"), reservationAuditShape("n1", "r1", capacity.ChainChanges), schedCursorShape("n1", "r1")
	tests := []struct {
		name, cursor string
		shape        keyShape
	}{
		{"not base64", "!!!", chain},
		{"padded base64", base64.URLEncoding.EncodeToString([]byte(`{"pk":"NODE#n1"}`)) + "=", chain},
		{"not json", b64("hello"), chain},
		{"empty object", b64(`{}`), chain},
		{"number value", b64(`{"pk":1,"sk":"SEQ#00000000000000000001"}`), chain},
		{"empty value", b64(`{"pk":"","sk":"SEQ#00000000000000000001"}`), chain},
		{"too long", string(make([]byte, 5000)), chain},
		{"another partition", b64(`{"pk":"NODE#n2","sk":"SEQ#00000000000000000001"}`), chain},
		{"no partition", b64(`{"sk":"SEQ#00000000000000000001"}`), chain},
		{"no sort key", b64(`{"pk":"NODE#n1"}`), chain},
		{"an extra attribute", b64(`{"pk":"NODE#n1","sk":"SEQ#00000000000000000001","x":"y"}`), chain},
		{"sort key of another prefix", b64(`{"pk":"NODE#n1","sk":"RES#r1"}`), chain},
		{"seq not of 20 digits", b64(`{"pk":"NODE#n1","sk":"SEQ#1"}`), chain},
		{"seq not digits", b64(`{"pk":"NODE#n1","sk":"SEQ#0000000000000000000x"}`), chain},
		{"unchained key without an id", b64(`{"pk":"NODE#n1","sk":"2026-01-02T03:04:05Z#"}`), chain},
		{"a table key on an index", b64(`{"pk":"NODE#n1","sk":"SEQ#00000000000000000001"}`), res},
		{"another reservation's entry", b64(`{"pk":"NODE#n1","sk":"SEQ#00000000000000000001","resKey":"NODE#n1#RES#r2"}`), res},
		{"another node's entry", b64(`{"pk":"NODE#n2","sk":"SEQ#00000000000000000001","resKey":"NODE#n1#RES#r1"}`), res},
		{"scheduled reclaim of another node", b64(`{"pk":"NODE#n2#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`), sched},
		{"scheduled reclaim of another list", b64(`{"pk":"NODE#n1#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r2#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`), sched},
		{"scheduled reclaim without index keys", b64(`{"pk":"NODE#n1#SCHED#s1","sk":"SCHED"}`), sched},
		{"scheduled index sort key not a time", b64(`{"pk":"NODE#n1#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"zzz#s1"}`), sched},
		{"scheduled id not an id", b64(`{"pk":"NODE#n1#SCHED#s#1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`), sched},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeCursor(tt.cursor, tt.shape)
			var ce *capacity.Error
			if !errors.As(err, &ce) || ce.Code != capacity.CodeInvalidRequest || ce.Message != "invalid cursor" {
				t.Fatalf("decodeCursor(%q) error = %v; want invalid_request \"invalid cursor\"", tt.cursor, err)
			}
		})
	}
}
