package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestTerminationStepsQueue: the queue of the workflow's later steps and its dead-letter
// queue, encrypted (SQS managed), TLS only; a step is dead-lettered after 5 receives; the
// visibility timeout is 6 times termination-steps' timeout. Only the state machine's role
// and termination-steps may send to it (an explicit Deny of every other principal, which no
// identity policy of the account can override); nothing sends to the dead-letter queue but
// SQS's redrive.
func TestTerminationStepsQueue(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			fnID, fn := functionByName(t, tp, env, "termination-steps")
			qID, dlqID := checkWorkQueue(t, tp, env, "capacity-"+env+"-termination-steps", fn, terminationStepsTimeoutSeconds, 4)

			_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
			_, pol := tp.one(t, "AWS::SQS::QueuePolicy", "Queues", []any{ref(qID)})
			want := []any{denyInsecure(qID), map[string]any{
				"Action": "sqs:SendMessage",
				"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": []any{
					getAtt(roleOf(t, sm, "RoleArn"), "Arn"), getAtt(roleOf(t, fn, "Role"), "Arn"),
				}}},
				"Effect":    "Deny",
				"Principal": map[string]any{"AWS": "*"},
				"Resource":  getAtt(qID, "Arn"),
				"Sid":       "OnlyTheWorkflowAndItsStepsSend",
			}}
			if got := props(pol)["PolicyDocument"].(map[string]any)["Statement"]; !reflect.DeepEqual(got, want) {
				t.Errorf("queue policy\n got %s\nwant %s", toJSON(got), toJSON(want))
			}
			_, dlqPol := tp.one(t, "AWS::SQS::QueuePolicy", "Queues", []any{ref(dlqID)})
			if got := props(dlqPol)["PolicyDocument"].(map[string]any)["Statement"]; !reflect.DeepEqual(got, []any{denyInsecure(dlqID)}) {
				t.Errorf("dead-letter queue policy %s", toJSON(got))
			}

			// termination-steps reads the queue in batches of 10 and reports the failed items only.
			_, m := tp.one(t, "AWS::Lambda::EventSourceMapping", "FunctionName", ref(fnID))
			wantESM := map[string]any{
				"BatchSize":             float64(10),
				"EventSourceArn":        getAtt(qID, "Arn"),
				"FunctionName":          ref(fnID),
				"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
				"Tags":                  []any{map[string]any{"Key": "env", "Value": env}, map[string]any{"Key": "project", "Value": "capacity"}},
			}
			if got := props(m); !reflect.DeepEqual(got, wantESM) {
				t.Errorf("event source mapping\n got %s\nwant %s", toJSON(got), toJSON(wantESM))
			}
		})
	}
}

// TestWhoRunsTheTermination: of every role of the stack, only the functions that start a
// reclaim's first step (api, reclaim-events, the reconciler; the floor benchmark, env local)
// and termination-steps (every later step) may start a run of the Express machine, and none
// may describe one (DescribeExecution does not answer for Express runs: the reconciler must
// not depend on it); only the state machine and termination-steps may send to the steps queue.
func TestWhoRunsTheTermination(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			starters := []string{"api", "reclaim-events", "reconciler", "termination-steps"}
			if env == "local" {
				starters = append(starters, "floor")
			}
			wantStart := map[string]bool{}
			for _, fn := range starters {
				_, r := functionByName(t, tp, env, fn)
				wantStart[roleOf(t, r, "Role")] = true
			}
			_, steps := functionByName(t, tp, env, "termination-steps")
			_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
			wantSend := map[string]bool{roleOf(t, steps, "Role"): true, roleOf(t, sm, "RoleArn"): true}
			stepsQueue := `"` + queueID(t, tp, "capacity-"+env+"-termination-steps") + `"`

			starts, sends := map[string]bool{}, map[string]bool{}
			cwRole := apiGatewayCloudWatchRoleID(t, tp) // only a managed policy: TestApiGatewayCloudWatchRole
			for id, role := range tp.resources("AWS::IAM::Role") {
				if id == cwRole {
					continue
				}
				for res, actions := range rolePermissions(t, tp, id, assumedBy(t, role), slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)...) {
					for _, a := range actions {
						switch {
						case a == "states:DescribeExecution" || a == "states:*" || a == "*":
							t.Errorf("role %s may %s on %s: nothing may describe the Express machine's runs", id, a, res)
						case a == "states:StartExecution":
							starts[id] = true
						case a == "sqs:SendMessage" && strings.Contains(res, stepsQueue):
							sends[id] = true
						}
					}
				}
			}
			if !reflect.DeepEqual(starts, wantStart) {
				t.Errorf("roles that may start the workflow %v, want %v", starts, wantStart)
			}
			if !reflect.DeepEqual(sends, wantSend) {
				t.Errorf("roles that may send to the steps queue %v, want %v", sends, wantSend)
			}
		})
	}
}
