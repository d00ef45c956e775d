package dynamo

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// The key item's stored names: the first layout's stay as they were (keys provisioned then
// decode unchanged), the key-management ones are added, and LastUsedAt is a number (epoch
// seconds) so that TouchKey's condition compares it.
func TestAPIKeyItemLayout(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	later := at.Add(time.Hour)
	full := capacity.APIKey{KeyID: "key-1", Hash: "h", OrgID: "o", Permissions: []string{"p"}, Operator: true,
		Revoked: true, ExpiresAt: &later, Description: "d", CreatedAt: at, CreatedByKeyID: "key-op",
		RevokedAt: &later, LastUsedAt: &at}
	item, err := attributevalue.MarshalMap(newAPIKeyItem(full))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range item {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"CreatedAt", "CreatedByKeyID", "Description", "ExpiresAt", "Hash", "KeyID", "LastUsedAt",
		"Operator", "OrgID", "Permissions", "Revoked", "RevokedAt", "pk", "sk", "type"}
	if !slices.Equal(names, want) {
		t.Errorf("attributes %v, want %v", names, want)
	}
	if _, ok := item["LastUsedAt"].(*types.AttributeValueMemberN); !ok {
		t.Errorf("LastUsedAt is %T, want a number", item["LastUsedAt"])
	}
	var back apiKeyItem
	if err := attributevalue.UnmarshalMap(item, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.apiKey(); !reflect.DeepEqual(got, full) {
		t.Errorf("round trip = %+v, want %+v", got, full)
	}

	// An item as the first layout stored it.
	old := map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "APIKEY#h"}, "sk": &types.AttributeValueMemberS{Value: "APIKEY"},
		"type": &types.AttributeValueMemberS{Value: "apikey"}, "KeyID": &types.AttributeValueMemberS{Value: "key-old"},
		"Hash": &types.AttributeValueMemberS{Value: "h"}, "OrgID": &types.AttributeValueMemberS{Value: "o"},
		"Permissions": &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberS{Value: "p"}}},
		"Operator":    &types.AttributeValueMemberBOOL{Value: false}, "Revoked": &types.AttributeValueMemberBOOL{Value: false},
		"ExpiresAt": &types.AttributeValueMemberNULL{Value: true},
	}
	var oldIt apiKeyItem
	if err := attributevalue.UnmarshalMap(old, &oldIt); err != nil {
		t.Fatal(err)
	}
	if got, want := oldIt.apiKey(), (capacity.APIKey{KeyID: "key-old", Hash: "h", OrgID: "o", Permissions: []string{"p"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("old item = %+v, want %+v", got, want)
	}
}
