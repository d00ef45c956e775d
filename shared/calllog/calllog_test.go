package calllog

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/smithy-go/middleware"
)

func TestFields(t *testing.T) {
	cases := []struct {
		name  string
		input any
		want  map[string]string
	}{
		{"get item: table and partition key, not the sort key",
			&dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]ddbtypes.AttributeValue{
				"pk": &ddbtypes.AttributeValueMemberS{Value: "NODE#n1"}, "sk": &ddbtypes.AttributeValueMemberS{Value: "META"}}},
			map[string]string{"TableName": "t", "Key.pk": "NODE#n1"}},
		{"put item: the item's partition key only",
			&dynamodb.PutItemInput{TableName: aws.String("t"), Item: map[string]ddbtypes.AttributeValue{
				"pk": &ddbtypes.AttributeValueMemberS{Value: "APIKEYS"}, "secret": &ddbtypes.AttributeValueMemberS{Value: "s3cr3t"}}},
			map[string]string{"TableName": "t", "Item.pk": "APIKEYS"}},
		{"transaction: each action's table and partition key, by index",
			&dynamodb.TransactWriteItemsInput{TransactItems: []ddbtypes.TransactWriteItem{
				{Put: &ddbtypes.Put{TableName: aws.String("a"), Item: map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: "X"}}}},
				{ConditionCheck: &ddbtypes.ConditionCheck{TableName: aws.String("b"), Key: map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: "Y"}}}},
			}},
			map[string]string{"TransactItems.0.Put.TableName": "a", "TransactItems.0.Put.Item.pk": "X",
				"TransactItems.1.ConditionCheck.TableName": "b", "TransactItems.1.ConditionCheck.Key.pk": "Y"}},
		{"batch get: each table's keys' partition keys, not their sort keys",
			&dynamodb.BatchGetItemInput{RequestItems: map[string]ddbtypes.KeysAndAttributes{"audit": {Keys: []map[string]ddbtypes.AttributeValue{
				{"pk": &ddbtypes.AttributeValueMemberS{Value: "NODE#n1"}, "sk": &ddbtypes.AttributeValueMemberS{Value: "SEQ#1"}},
				{"pk": &ddbtypes.AttributeValueMemberS{Value: "NODE#n2"}, "sk": &ddbtypes.AttributeValueMemberS{Value: "SEQ#2"}},
			}}}},
			map[string]string{"RequestItems.audit.Keys.0.pk": "NODE#n1", "RequestItems.audit.Keys.1.pk": "NODE#n2"}},
		{"query: the key condition and the values it names, not the filter's",
			&dynamodb.QueryInput{TableName: aws.String("t"), IndexName: aws.String("byState"),
				KeyConditionExpression: aws.String("#0 = :0"), FilterExpression: aws.String("#1 = :1"),
				ExpressionAttributeNames: map[string]string{"#0": "gsi1pk", "#1": "state"},
				ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{
					":0": &ddbtypes.AttributeValueMemberS{Value: "OP#pending"}, ":1": &ddbtypes.AttributeValueMemberS{Value: "x"}}},
			map[string]string{"TableName": "t", "IndexName": "byState", "KeyConditionExpression": "#0 = :0",
				"ExpressionAttributeNames.#0": "gsi1pk", "ExpressionAttributeNames.#1": "state", "ExpressionAttributeValues.:0": "OP#pending"}},
		{"update without a key condition: no expression values",
			&dynamodb.UpdateItemInput{TableName: aws.String("t"), ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{
				":v": &ddbtypes.AttributeValueMemberS{Value: "data"}}},
			map[string]string{"TableName": "t"}},
		{"kms encrypt: key and context, never the plaintext",
			&kms.EncryptInput{KeyId: aws.String("arn:k"), Plaintext: []byte("secret"),
				EncryptionContext: map[string]string{"purpose": "p", "nodeId": "n1"}},
			map[string]string{"KeyId": "arn:k", "EncryptionContext.purpose": "p", "EncryptionContext.nodeId": "n1"}},
		{"put events: each entry's bus and source, not its detail",
			&eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{
				{EventBusName: aws.String("bus"), Source: aws.String("src"), DetailType: aws.String("dt"), Detail: aws.String(`{"a":1}`)}}},
			map[string]string{"Entries.0.EventBusName": "bus", "Entries.0.Source": "src", "Entries.0.DetailType": "dt"}},
		{"create schedule: group, name and the target's role",
			&scheduler.CreateScheduleInput{Name: aws.String("s"), GroupName: aws.String("g"),
				Target: &schedtypes.Target{Arn: aws.String("arn:bus"), RoleArn: aws.String("arn:role"), Input: aws.String("{}")}},
			map[string]string{"Name": "s", "GroupName": "g", "Target.Arn": "arn:bus", "Target.RoleArn": "arn:role"}},
		{"nothing to record", &dynamodb.ListTablesInput{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Fields(c.input); !maps.Equal(got, c.want) {
				t.Errorf("Fields = %v, want %v", got, c.want)
			}
		})
	}
}

// TestLogRecordsEachCallOnce: calls through a client with the log's APIOption land in the
// file once each, with the principal, service and operation, and Read merges the processes'
// files without repeats.
func TestLogRecordsEachCallOnce(t *testing.T) {
	dir := t.TempDir()
	l := New(dir, "capacity-local-api")
	client := dynamodb.New(dynamodb.Options{Region: "us-east-1", APIOptions: []func(*middlewareStack) error{l.APIOption},
		HTTPClient: failingHTTP{}, RetryMaxAttempts: 1, Credentials: aws.AnonymousCredentials{}})
	for range 3 {
		_, _ = client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String("t")})
	}
	_, _ = client.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: aws.String("k"),
		Key: map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: "K"}}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Another process's file with a repeat and a torn last line.
	other := `{"principal":"capacity-local-api","service":"DynamoDB","operation":"GetItem","fields":{"TableName":"t"}}` + "\n" + `{"principal":"x","serv`
	if err := os.WriteFile(filepath.Join(dir, "capacity-local-api.1.jsonl"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	calls, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Call{
		{Principal: "capacity-local-api", Service: "DynamoDB", Operation: "GetItem", Fields: map[string]string{"TableName": "t"}},
		{Principal: "capacity-local-api", Service: "DynamoDB", Operation: "DeleteItem", Fields: map[string]string{"TableName": "k", "Key.pk": "K"}},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("Read = %+v, want %+v", calls, want)
	}
}

type middlewareStack = middleware.Stack

// failingHTTP fails every request: the log records before the transport.
type failingHTTP struct{}

func (failingHTTP) Do(*http.Request) (*http.Response, error) {
	return nil, errors.New("no network in this test")
}
