package main

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/stackoutput"
	"github.com/openrelay/capacity/shared/table"
)

func TestOutputs(t *testing.T) {
	tp := synth(t, "local")
	outs := tp["Outputs"].(map[string]any)
	var keys []string
	for k := range outs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{
		"AgentMasterSecretId", "AlarmTopicArn", "ApiFunctionName", "ApiUrl", "AuditTableName", "Env", "EventBusArn", "EventBusName",
		"KeysTableName", "OperationEventsFunctionName", "ReclaimEventsFunctionName", "ReclaimRequestsDeadLetterQueueUrl",
		"ReclaimRequestsQueueUrl", "ReconcilerFunctionName", "ScheduleGroupName", "StateMachineArn", "StateTableName", "TerminateNodeFunctionName",
	}; !reflect.DeepEqual(keys, want) {
		t.Errorf("outputs %v, want %v", keys, want)
	}
	if names := slices.Sorted(slices.Values(stackoutput.All)); !reflect.DeepEqual(keys, names) {
		t.Errorf("outputs %v, stackoutput.All %v", keys, names)
	}
	value := func(k string) any { return outs[k].(map[string]any)["Value"] }
	fnID, _ := apiFunction(t, tp, "local")
	terminateID, _ := functionByName(t, tp, "local", "terminate-node")
	reconcilerID, _ := functionByName(t, tp, "local", "reconciler")
	reclaimEventsID, _ := functionByName(t, tp, "local", "reclaim-events")
	operationEventsID, _ := functionByName(t, tp, "local", "operation-events")
	busID := eventBusID(t, tp, "local")
	for k, want := range map[string]any{
		"EventBusName":                      ref(busID), // Ref of a bus is its name
		"EventBusArn":                       getAtt(busID, "Arn"),
		"ReclaimRequestsQueueUrl":           ref(queueID(t, tp, "capacity-local-reclaim-requests")), // Ref of a queue is its URL
		"ReclaimRequestsDeadLetterQueueUrl": ref(queueID(t, tp, "capacity-local-reclaim-requests-dlq")),
		"ScheduleGroupName":                 "capacity-local",
		"ReclaimEventsFunctionName":         ref(reclaimEventsID),
		"OperationEventsFunctionName":       ref(operationEventsID),
		"StateTableName":                    ref(tableID(t, tp, table.State, "local")),
		"AuditTableName":                    ref(tableID(t, tp, table.Audit, "local")),
		"KeysTableName":                     ref(tableID(t, tp, table.Keys, "local")),
		"ApiFunctionName":                   ref(fnID),
		"StateMachineArn":                   ref(stateMachineID(t, tp, "local")),
		"TerminateNodeFunctionName":         ref(terminateID),
		"ReconcilerFunctionName":            ref(reconcilerID),
		"AgentMasterSecretId":               ref(agentMasterSecretID(t, tp, "local")),
		"AlarmTopicArn":                     ref(alarmTopicID(t, tp, "local")), // Ref of a topic is its ARN
		"Env":                               "local",
	} {
		if !reflect.DeepEqual(value(k), want) {
			t.Errorf("output %s = %s, want %s", k, toJSON(value(k)), toJSON(want))
		}
	}
	url := toJSON(value("ApiUrl"))
	apiID, _ := tp.one(t, "AWS::ApiGateway::RestApi", "Name", "capacity-local-api")
	stageID, _ := tp.one(t, "AWS::ApiGateway::Stage", "StageName", "local")
	for _, s := range []string{`"https://"`, toJSON(ref(apiID)), ".execute-api.", toJSON(ref(stageID))} {
		if !strings.Contains(url, s) {
			t.Errorf("ApiUrl %s lacks %s", url, s)
		}
	}
}
