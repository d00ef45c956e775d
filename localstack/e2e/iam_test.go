package e2e

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/iamcheck"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/calllog"
	"github.com/openrelay/capacity/shared/stackoutput"
)

// checkIAM checks every AWS call the local stack's functions logged (and the calls the stack
// made for them: a queue's polls as its function's role, a schedule's firing as the
// scheduler's role) against the synthesised template's IAM policies. A call they do not
// allow would fail with AccessDenied on AWS, which the emulator never answers.
func checkIAM(w io.Writer) error {
	setup, err := localStack.IAM()
	if err != nil {
		return fmt.Errorf("IAM check: %w", err)
	}
	calls, err := calllog.Read(localStack.CallLogDir())
	if err != nil {
		return fmt.Errorf("IAM check: %w", err)
	}
	findings := iamcheck.Check(setup, calls)
	principals := map[string]bool{}
	for _, c := range calls {
		principals[c.Principal] = true
	}
	fmt.Fprintf(w, "e2e: IAM check: %d distinct AWS calls by %s against the template's policies (log: %s)\n",
		len(calls), strings.Join(slicesSorted(principals), ", "), localStack.CallLogDir())
	if len(findings) == 0 {
		return nil
	}
	lines := make([]string, len(findings))
	for i, f := range findings {
		lines[i] = "  " + f.String()
	}
	return fmt.Errorf("IAM check: %d calls the synthesised IAM policies do not allow (AccessDenied on AWS):\n%s",
		len(findings), strings.Join(lines, "\n"))
}

func slicesSorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// functionEnv returns a variable of the stack's function whose code is ./functions/<code>.
func functionEnv(t *testing.T, code, name string) string {
	t.Helper()
	for _, fn := range localStack.Functions() {
		if fn.Code != code {
			continue
		}
		for _, kv := range fn.Env {
			if k, v, _ := strings.Cut(kv, "="); k == name {
				return v
			}
		}
	}
	t.Fatalf("function %s has no %s", code, name)
	return ""
}

// TestIAMCheckRefusesPlantedCalls: the check that runs after the tests fails a call the
// template's policies do not allow, naming function, action and resource, and passes their
// allowed neighbours. The first plant is a real call, made through the call log as the api
// function would make it: a DeleteItem on the keys table, which no role may do.
func TestIAMCheckRefusesPlantedCalls(t *testing.T) {
	if localStack == nil {
		t.Skip("the IAM check runs on the local stack only")
	}
	// The api function's own calls are in the log: recording works in the bootstraps.
	if r := call(t, "GET", "/v1/nodes/"+newNode(t, nil)+"/reservations/res-1", keyOperator, nil); r.Status != 200 {
		t.Fatalf("GET reservation: %d %s", r.Status, r.Body)
	}
	base, err := calllog.Read(localStack.CallLogDir())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(base, func(c calllog.Call) bool { return c.Principal == "capacity-local-api" && c.Operation == "Query" }) {
		t.Fatalf("the call log holds no Query of the api function: %d calls", len(base))
	}
	setup, err := localStack.IAM()
	if err != nil {
		t.Fatal(err)
	}

	keysTable := outputs[stackoutput.KeysTableName]
	planted := plantDeleteItem(t, "capacity-local-api", keysTable)
	kmsKey := functionEnv(t, "terminate-node", "AGENT_KEYS_KMS_KEY_ID")
	schedulerRole := functionEnv(t, "api", "SCHEDULE_ROLE_ARN")
	bus := outputs[stackoutput.EventBusName]
	state := outputs[stackoutput.StateTableName]
	tableARN := func(name string) string { return "arn:aws:dynamodb:us-east-1:000000000000:table/" + name }
	busARN := "arn:aws:events:us-east-1:000000000000:event-bus/" + bus
	update := func(fn, pk string) calllog.Call {
		return calllog.Call{Principal: fn, Service: "DynamoDB", Operation: "UpdateItem", Fields: map[string]string{"TableName": state, "Key.pk": pk}}
	}
	putEvents := func(principal, source string) calllog.Call {
		return calllog.Call{Principal: principal, Service: "EventBridge", Operation: "PutEvents",
			Fields: map[string]string{"Entries.0.EventBusName": bus, "Entries.0.Source": source}}
	}
	decrypt := func(fn string, context map[string]string) calllog.Call {
		f := map[string]string{"KeyId": kmsKey}
		for k, v := range context {
			f["EncryptionContext."+k] = v
		}
		return calllog.Call{Principal: fn, Service: "KMS", Operation: "Decrypt", Fields: f}
	}
	agentKey := map[string]string{"purpose": "capacity-agent-key", "nodeId": "n1"}

	cases := []struct {
		name             string
		call             calllog.Call
		action, resource string // of the finding; "" if allowed
	}{
		{"api deletes an API key (a real call)", planted, "dynamodb:DeleteItem", tableARN(keysTable)},
		{"reconciler updates a node item", update("capacity-local-reconciler", "NODE#n1"), "dynamodb:UpdateItem", tableARN(state)},
		{"reconciler updates an operation item", update("capacity-local-reconciler", "NODE#n1#OP#rcl_1"), "", ""},
		{"api reads an audit record", calllog.Call{Principal: "capacity-local-api", Service: "DynamoDB", Operation: "GetItem",
			Fields: map[string]string{"TableName": outputs[stackoutput.AuditTableName], "Key.pk": "NODE#n1"}}, "", ""},
		{"api publishes as the service", putEvents("capacity-local-api", "openrelay.capacity"), "events:PutEvents", busARN},
		{"operation-events publishes as the service", putEvents("capacity-local-operation-events", "openrelay.capacity"), "", ""},
		{"operation-events passes for a schedule", putEvents("capacity-local-operation-events", "openrelay.capacity.schedule"), "events:PutEvents", busARN},
		{"the scheduler role fires a schedule", putEvents(schedulerRole, "openrelay.capacity.schedule"), "", ""},
		{"the scheduler role passes for the service", putEvents(schedulerRole, "openrelay.capacity"), "events:PutEvents", busARN},
		{"terminate-node opens an agent key", decrypt("capacity-local-terminate-node", agentKey), "", ""},
		{"terminate-node decrypts without a node id", decrypt("capacity-local-terminate-node", map[string]string{"purpose": "capacity-agent-key"}), "kms:Decrypt", kmsKey},
		{"api opens an agent key (the key policy denies it)", decrypt("capacity-local-api", agentKey), "kms:Decrypt", kmsKey},
		{"api schedules in another group", calllog.Call{Principal: "capacity-local-api", Service: "Scheduler", Operation: "GetSchedule",
			Fields: map[string]string{"GroupName": "default", "Name": "s1"}}, "scheduler:GetSchedule", "arn:aws:scheduler:us-east-1:000000000000:schedule/default/s1"},
	}
	before := findingKeys(iamcheck.Check(setup, base))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			after := iamcheck.Check(setup, append(slices.Clip(base), c.call))
			var added []iamcheck.Finding
			for _, f := range after {
				if !before[findingKey(f)] {
					added = append(added, f)
				}
			}
			if c.action == "" {
				if len(added) > 0 {
					t.Fatalf("the check refuses an allowed call: %v", added)
				}
				return
			}
			if len(added) != 1 {
				t.Fatalf("the check found %d new findings, want 1: %v", len(added), added)
			}
			f := added[0]
			if f.Principal != c.call.Principal || f.Action != c.action || f.Resource != c.resource {
				t.Errorf("finding %v, want %s: %s on %s", f, c.call.Principal, c.action, c.resource)
			}
			// The message that fails the run names all three.
			for _, want := range []string{c.call.Principal, c.action, c.resource} {
				if !strings.Contains(f.String(), want) {
					t.Errorf("finding %q does not name %q", f, want)
				}
			}
		})
	}
}

// plantDeleteItem makes a real DeleteItem on table (of an item that does not exist) through
// a call log, as function fn would, and returns the logged call.
func plantDeleteItem(t *testing.T, fn, tableName string) calllog.Call {
	t.Helper()
	dir := t.TempDir()
	log := calllog.New(dir, fn)
	db := dynamodb.NewFromConfig(stack.AWSConfig(endpoint), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, log.APIOption)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(tableName), Key: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "PLANTED"}, "sk": &types.AttributeValueMemberS{Value: "PLANTED"}}})
	if err != nil {
		t.Fatalf("planted DeleteItem: %v (the emulator enforces no IAM, so it should succeed)", err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	calls, err := calllog.Read(dir)
	if err != nil || len(calls) != 1 {
		t.Fatalf("planted call log: %v %v", calls, err)
	}
	return calls[0]
}

func findingKey(f iamcheck.Finding) string {
	return f.Principal + " " + f.Action + " " + f.Resource + " " + f.Reason
}

func findingKeys(fs []iamcheck.Finding) map[string]bool {
	out := map[string]bool{}
	for _, f := range fs {
		out[findingKey(f)] = true
	}
	return out
}
