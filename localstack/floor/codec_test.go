package floor_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/floor"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// every holds one attribute value of each kind, empty collections included: a lost empty list
// (a reservation's released units, say) would change what the floor writes.
var every = map[string]types.AttributeValue{
	"s": &types.AttributeValueMemberS{Value: "x"}, "n": &types.AttributeValueMemberN{Value: "42"},
	"b": &types.AttributeValueMemberB{Value: []byte{0, 1}}, "t": &types.AttributeValueMemberBOOL{Value: true},
	"f": &types.AttributeValueMemberBOOL{Value: false}, "null": &types.AttributeValueMemberNULL{Value: true},
	"ss": &types.AttributeValueMemberSS{Value: []string{"a", "b"}}, "ns": &types.AttributeValueMemberNS{Value: []string{"1"}},
	"bs":     &types.AttributeValueMemberBS{Value: [][]byte{{2}}},
	"emptyL": &types.AttributeValueMemberL{Value: []types.AttributeValue{}},
	"emptyM": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{}},
	"nested": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		"l": &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberS{Value: "y"}, &types.AttributeValueMemberN{Value: "1"}}},
	}},
}

// storeCommit is a reclaim's commit as the store would write it: node, reservation with no
// released unit left, two victims, operation, idempotency record, audit.
func storeCommit(t *testing.T) *dynamodb.TransactWriteItemsInput {
	t.Helper()
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	res := capacity.Reservation{ID: "r1", NodeID: "n1", ReleasedUnitIDs: []string{}, Version: 3, UpdatedAt: now}
	victims := []capacity.VM{{ID: "vm-1", NodeID: "n1", State: capacity.VMRunning, Version: 1}, {ID: "vm-2", NodeID: "n1", State: capacity.VMRunning, Version: 2}}
	c := capacity.Commit{
		Node: capacity.Node{ID: "n1", Version: 7}, BumpNode: true, Reservation: &res, Evict: victims,
		Operation:   &capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpPendingStart, VMIDs: capacity.VMIDs(victims), CreatedAt: now},
		Idempotency: &capacity.IdempotencyRecord{Scope: "o#k", NodeID: "n1", Fingerprint: "f", Result: []byte(`{}`), CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
		Audit:       capacity.AuditRecord{ID: "a1", Time: now, NodeID: "n1", Action: capacity.ActionReclaim, Outcome: "ok"},
	}
	in, err := dynamo.New(nil, "state", "audit").TransactInput(c)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// The floor must send exactly what the store would: every input survives the trip through
// the request body unchanged.
func TestInputsSurviveTheBody(t *testing.T) {
	queries := []*dynamodb.QueryInput{
		{TableName: aws.String("state"), KeyConditionExpression: aws.String("#0 = :0 AND #1 >= :1"),
			ExpressionAttributeNames: map[string]string{"#0": "pk", "#1": "sk"}, ExpressionAttributeValues: every,
			ConsistentRead: aws.Bool(true)},
		{TableName: aws.String("state"), IndexName: aws.String("byState"), KeyConditionExpression: aws.String("#0 = :0"),
			FilterExpression: aws.String("#1 <> :1"), ProjectionExpression: aws.String("#0"), Limit: aws.Int32(5), ScanIndexForward: aws.Bool(false)},
	}
	for i, q := range queries {
		enc, err := floor.QueryOf(q)
		if err != nil {
			t.Fatal(err)
		}
		var back floor.Query
		roundTrip(t, enc, &back)
		got, err := back.Input()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, q) {
			t.Errorf("query %d: got %+v, want %+v", i, got, q)
		}
	}

	transacts := map[string]*dynamodb.TransactWriteItemsInput{
		"store's reclaim commit": storeCommit(t),
		"every kind": {TransactItems: []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String("t"), Item: every, ConditionExpression: aws.String("attribute_not_exists(#0)"), ExpressionAttributeNames: map[string]string{"#0": "pk"}}},
			{Update: &types.Update{TableName: aws.String("t"), Key: every, UpdateExpression: aws.String("SET #0 = :0"), ExpressionAttributeValues: every}},
			{ConditionCheck: &types.ConditionCheck{TableName: aws.String("t"), Key: every, ConditionExpression: aws.String("#0 = :0")}},
			{Delete: &types.Delete{TableName: aws.String("t"), Key: every}},
		}},
	}
	for name, tx := range transacts {
		enc, err := floor.TransactOf(tx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var back []floor.Action
		roundTrip(t, enc, &back)
		got, err := floor.TransactInput(back)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, tx) {
			t.Errorf("%s: the items changed on the way:\n got %+v\nwant %+v", name, got, tx)
		}
	}
}

func roundTrip(t *testing.T, v, out any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}
