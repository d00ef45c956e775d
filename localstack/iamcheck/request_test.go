package iamcheck

import (
	"reflect"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/calllog"
)

func TestRequests(t *testing.T) {
	acct := Account{Partition: "aws", Region: "us-east-1", ID: "000000000000"}
	tables := map[string]TableKeys{"state": {Partition: "pk", Indexes: map[string]string{"byState": "gsi1pk"}}}
	arn := func(r string) string { return "arn:aws:" + r }
	lk := func(v ...string) map[string][]string { return map[string][]string{"dynamodb:LeadingKeys": v} }
	ddbKnown := []string{"dynamodb:LeadingKeys"}
	call := func(service, op string, fields map[string]string) calllog.Call {
		return calllog.Call{Principal: "f", Service: service, Operation: op, Fields: fields}
	}
	tests := []struct {
		name    string
		call    calllog.Call
		want    []Request
		wantErr string
	}{
		{"get item: table ARN and its partition key", call("DynamoDB", "GetItem", map[string]string{"TableName": "state", "Key.pk": "NODE#n1"}),
			[]Request{{Action: "dynamodb:GetItem", Resource: arn("dynamodb:us-east-1:000000000000:table/state"), Context: lk("NODE#n1"), Known: ddbKnown}}, ""},
		{"transaction: one request per item action", call("DynamoDB", "TransactWriteItems", map[string]string{
			"TransactItems.0.Update.TableName": "state", "TransactItems.0.Update.Key.pk": "NODE#n1",
			"TransactItems.1.Put.TableName": "audit", "TransactItems.1.Put.Item.pk": "NODE#n1",
			"TransactItems.2.ConditionCheck.TableName": "state", "TransactItems.2.ConditionCheck.Key.pk": "NODE#n2"}),
			[]Request{
				{Action: "dynamodb:UpdateItem", Resource: arn("dynamodb:us-east-1:000000000000:table/state"), Context: lk("NODE#n1"), Known: ddbKnown},
				{Action: "dynamodb:PutItem", Resource: arn("dynamodb:us-east-1:000000000000:table/audit"), Known: ddbKnown},
				{Action: "dynamodb:ConditionCheckItem", Resource: arn("dynamodb:us-east-1:000000000000:table/state"), Context: lk("NODE#n2"), Known: ddbKnown},
			}, ""},
		{"query: the key condition's partition value", call("DynamoDB", "Query", map[string]string{"TableName": "state",
			"KeyConditionExpression": "#0 = :0 AND begins_with (#1, :1)", "ExpressionAttributeNames.#0": "pk", "ExpressionAttributeNames.#1": "sk",
			"ExpressionAttributeValues.:0": "NODE#n1", "ExpressionAttributeValues.:1": "VM#"}),
			[]Request{{Action: "dynamodb:Query", Resource: arn("dynamodb:us-east-1:000000000000:table/state"), Context: lk("NODE#n1"), Known: ddbKnown}}, ""},
		{"query on an index: its own partition key", call("DynamoDB", "Query", map[string]string{"TableName": "state", "IndexName": "byState",
			"KeyConditionExpression": "#1 = :s AND #0 = :p", "ExpressionAttributeNames.#0": "gsi1pk", "ExpressionAttributeNames.#1": "gsi1sk",
			"ExpressionAttributeValues.:p": "OP#pending", "ExpressionAttributeValues.:s": "x"}),
			[]Request{{Action: "dynamodb:Query", Resource: arn("dynamodb:us-east-1:000000000000:table/state/index/byState"), Context: lk("OP#pending"), Known: ddbKnown}}, ""},
		{"an item call without its partition key is refused, not guessed", call("DynamoDB", "UpdateItem", map[string]string{"TableName": "state"}),
			nil, "no value of its partition key"},
		{"scan: no partition", call("DynamoDB", "Scan", map[string]string{"TableName": "state"}),
			[]Request{{Action: "dynamodb:Scan", Resource: arn("dynamodb:us-east-1:000000000000:table/state"), Known: ddbKnown}}, ""},
		{"batch get: per table, the partition keys of its keys", call("DynamoDB", "BatchGetItem", map[string]string{
			"RequestItems.audit.Keys.0.pk": "NODE#n2", "RequestItems.audit.Keys.1.pk": "NODE#n1", "RequestItems.audit.Keys.2.pk": "NODE#n1"}),
			[]Request{{Action: "dynamodb:BatchGetItem", Resource: arn("dynamodb:us-east-1:000000000000:table/audit"), Context: lk("NODE#n1", "NODE#n2"), Known: ddbKnown}}, ""},
		{"batch get without keys is refused", call("DynamoDB", "BatchGetItem", nil), nil, "holds no table or no key"},
		{"batch writes are not mapped", call("DynamoDB", "BatchWriteItem", nil), nil, "no IAM mapping for DynamoDB BatchWriteItem"},
		{"start execution", call("SFN", "StartExecution", map[string]string{"StateMachineArn": arn("states:us-east-1:000000000000:stateMachine:m"), "Name": "x"}),
			[]Request{{Action: "states:StartExecution", Resource: arn("states:us-east-1:000000000000:stateMachine:m")}}, ""},
		{"describe execution", call("SFN", "DescribeExecution", map[string]string{"ExecutionArn": arn("states:us-east-1:000000000000:execution:m:x")}),
			[]Request{{Action: "states:DescribeExecution", Resource: arn("states:us-east-1:000000000000:execution:m:x")}}, ""},
		{"put events: per entry, bus by name or ARN", call("EventBridge", "PutEvents", map[string]string{
			"Entries.0.EventBusName": "capacity-local", "Entries.0.Source": "s", "Entries.0.DetailType": "d",
			"Entries.1.EventBusName": arn("events:us-east-1:000000000000:event-bus/capacity-local"), "Entries.1.Source": "s2"}),
			[]Request{
				{Action: "events:PutEvents", Resource: arn("events:us-east-1:000000000000:event-bus/capacity-local"),
					Context: map[string][]string{"events:source": {"s"}, "events:detail-type": {"d"}}, Known: []string{"events:source", "events:detail-type"}},
				{Action: "events:PutEvents", Resource: arn("events:us-east-1:000000000000:event-bus/capacity-local"),
					Context: map[string][]string{"events:source": {"s2"}}, Known: []string{"events:source", "events:detail-type"}},
			}, ""},
		{"kms: the key and its encryption context", call("KMS", "Encrypt", map[string]string{"KeyId": "k1", "EncryptionContext.purpose": "p", "EncryptionContext.nodeId": "n1"}),
			[]Request{{Action: "kms:Encrypt", Resource: arn("kms:us-east-1:000000000000:key/k1"),
				Context: map[string][]string{"kms:EncryptionContext:purpose": {"p"}, "kms:EncryptionContext:nodeId": {"n1"}, "kms:EncryptionContextKeys": {"nodeId", "purpose"}},
				Known:   []string{"kms:EncryptionContext:", "kms:EncryptionContextKeys"}}}, ""},
		{"kms by alias is not modelled", call("KMS", "Decrypt", map[string]string{"KeyId": "alias/x"}), nil, "only calls that name the key"},
		{"create schedule passes its role", call("Scheduler", "CreateSchedule", map[string]string{"GroupName": "g", "Name": "s", "Target.RoleArn": arn("iam::000000000000:role/r")}),
			[]Request{
				{Action: "scheduler:CreateSchedule", Resource: arn("scheduler:us-east-1:000000000000:schedule/g/s")},
				{Action: "iam:PassRole", Resource: arn("iam::000000000000:role/r"),
					Context: map[string][]string{"iam:PassedToService": {"scheduler.amazonaws.com"}}, Known: []string{"iam:PassedToService"}},
			}, ""},
		{"get schedule in the default group", call("Scheduler", "GetSchedule", map[string]string{"Name": "s"}),
			[]Request{{Action: "scheduler:GetSchedule", Resource: arn("scheduler:us-east-1:000000000000:schedule/default/s")}}, ""},
		{"sqs batch delete is DeleteMessage", call("SQS", "DeleteMessageBatch", map[string]string{"QueueUrl": "http://localhost:4566/000000000000/q"}),
			[]Request{{Action: "sqs:DeleteMessage", Resource: arn("sqs:us-east-1:000000000000:q")}}, ""},
		{"secret by ARN", call("Secrets Manager", "GetSecretValue", map[string]string{"SecretId": arn("secretsmanager:us-east-1:000000000000:secret:m-AbCdEf")}),
			[]Request{{Action: "secretsmanager:GetSecretValue", Resource: arn("secretsmanager:us-east-1:000000000000:secret:m-AbCdEf")}}, ""},
		{"an unknown service", call("S3", "GetObject", nil), nil, "no IAM mapping for S3 GetObject"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Requests(tc.call, acct, tables)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Requests =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// TestCheck: findings name the function, its role, the action and the resource; repeats of
// one refusal fold into one finding; an unknown principal or call is a finding too.
func TestCheck(t *testing.T) {
	setup := Setup{
		Account:   Account{Partition: "aws", Region: "us-east-1", ID: "000000000000"},
		Tables:    map[string]TableKeys{"keys": {Partition: "pk"}},
		Functions: map[string]string{"capacity-local-api": role},
		Roles: map[string]Role{role: {LogicalID: "ApiRole", ARN: role, Statements: []Statement{
			allow(list("dynamodb:GetItem"), list("arn:aws:dynamodb:us-east-1:000000000000:table/keys"))}}},
	}
	get := calllog.Call{Principal: "capacity-local-api", Service: "DynamoDB", Operation: "GetItem", Fields: map[string]string{"TableName": "keys", "Key.pk": "A"}}
	del := func(pk string) calllog.Call {
		return calllog.Call{Principal: "capacity-local-api", Service: "DynamoDB", Operation: "DeleteItem", Fields: map[string]string{"TableName": "keys", "Key.pk": pk}}
	}
	stranger := calllog.Call{Principal: "capacity-local-ghost", Service: "DynamoDB", Operation: "GetItem", Fields: map[string]string{"TableName": "keys", "Key.pk": "A"}}
	unknown := calllog.Call{Principal: "capacity-local-api", Service: "S3", Operation: "GetObject"}

	if f := Check(setup, []calllog.Call{get}); len(f) != 0 {
		t.Fatalf("allowed call refused: %v", f)
	}
	got := Check(setup, []calllog.Call{get, del("A"), del("B"), stranger, unknown})
	var lines []string
	for _, f := range got {
		lines = append(lines, f.String())
	}
	want := []string{
		"capacity-local-api (role ApiRole): S3:GetObject on ? is not allowed: no IAM mapping for S3 GetObject: add one to iamcheck.Requests [S3 GetObject, 1 distinct call(s)]",
		"capacity-local-api (role ApiRole): dynamodb:DeleteItem on arn:aws:dynamodb:us-east-1:000000000000:table/keys is not allowed: no statement allows it [DynamoDB DeleteItem, 2 distinct call(s); e.g. dynamodb:LeadingKeys=A]",
		"capacity-local-ghost (role ?): DynamoDB:GetItem on ? is not allowed: the template has no role for this principal [DynamoDB GetItem, 1 distinct call(s)]",
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
