package main

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/stepfn"
)

// definition returns the state machine's ASL document, decoded.
func definition(t *testing.T, tp tmpl, env string) map[string]any {
	t.Helper()
	_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
	if props(sm)["Definition"] != nil || props(sm)["DefinitionS3Location"] != nil || props(sm)["DefinitionSubstitutions"] != nil {
		t.Fatalf("want the definition in DefinitionString only: %s", toJSON(props(sm)))
	}
	var def map[string]any
	if err := json.Unmarshal([]byte(flatten(t, props(sm)["DefinitionString"])), &def); err != nil {
		t.Fatalf("definition is not JSON: %v", err)
	}
	return def
}

func TestTerminationStateMachine(t *testing.T) {
	for _, tc := range []struct {
		env          string
		wait         float64
		executionArn [2]string // TerminateNode payload key and value
		retention    float64
		deletion     string
	}{
		{"local", 2, [2]string{"executionArn", LocalExecutionArn}, 7, "Delete"},
		{"dev", 2, [2]string{"executionArn.$", "$$.Execution.Id"}, 7, "Delete"},
		{"prod", 10, [2]string{"executionArn.$", "$$.Execution.Id"}, 90, "Retain"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			smID := stateMachineID(t, tp, tc.env)
			sm := tp.resources("AWS::StepFunctions::StateMachine")[smID]
			p := props(sm)
			if p["StateMachineType"] != "EXPRESS" {
				t.Errorf("StateMachineType %v, want EXPRESS", p["StateMachineType"])
			}
			if n := len(tp.resources("AWS::StepFunctions::StateMachine")); n != 1 {
				t.Errorf("%d state machines, want 1", n)
			}
			// Level ERROR: a succeeded run writes nothing; a failed one its data.
			lgID := logGroupID(t, tp, "/aws/vendedlogs/states/capacity-"+tc.env+"-termination-express")
			wantLogging := map[string]any{
				"Destinations":         []any{map[string]any{"CloudWatchLogsLogGroup": map[string]any{"LogGroupArn": getAtt(lgID, "Arn")}}},
				"IncludeExecutionData": true,
				"Level":                "ERROR",
			}
			if !reflect.DeepEqual(p["LoggingConfiguration"], wantLogging) {
				t.Errorf("LoggingConfiguration %s, want %s", toJSON(p["LoggingConfiguration"]), toJSON(wantLogging))
			}
			if !reflect.DeepEqual(p["TracingConfiguration"], map[string]any{"Enabled": true}) {
				t.Errorf("TracingConfiguration %s, want enabled", toJSON(p["TracingConfiguration"]))
			}
			lg := tp.resources("AWS::Logs::LogGroup")[lgID]
			if props(lg)["RetentionInDays"] != tc.retention || lg["DeletionPolicy"] != tc.deletion {
				t.Errorf("workflow log group retention %v deletion %v, want %v %s", props(lg)["RetentionInDays"], lg["DeletionPolicy"], tc.retention, tc.deletion)
			}

			def := definition(t, tp, tc.env)
			if def["StartAt"] != "Step?" || def["TimeoutSeconds"] != float64(300) {
				t.Errorf("StartAt %v TimeoutSeconds %v, want Step? 300", def["StartAt"], def["TimeoutSeconds"])
			}
			states := def["States"].(map[string]any)
			if got := keysOf(states); !reflect.DeepEqual(got, []string{"AllTerminated?", "GraceLeft?", "Notify", "NotifyAgents",
				"Report", "ScheduleRetry", "ScheduleRound", "Scheduled", "Step?", "TerminateNode"}) {
				t.Fatalf("states %v", got)
			}
			for name, st := range states {
				if st.(map[string]any)["Type"] == "Wait" {
					t.Errorf("%s is a Wait state: an Express run must not wait (a message delay does)", name)
				}
			}
			// A round step: Step? -> TerminateNode -> AllTerminated? -> Report (End).
			if got := stateOrder(t, def); !reflect.DeepEqual(got, []string{"Step?", "TerminateNode", "AllTerminated?", "Report"}) {
				t.Errorf("state order %v", got)
			}

			// operation-events, told the phase and the operation from the state (the execution
			// input, or the last round's output); its answer discarded so that the next state
			// sees the state; retried like TerminateNode.
			eventsFnID, _ := functionByName(t, tp, tc.env, "operation-events")
			publishTask := func(phase, next string) map[string]any {
				task := map[string]any{
					"Type":     "Task",
					"Resource": "arn:${AWS::Partition}:states:::lambda:invoke",
					"Parameters": map[string]any{
						"FunctionName": "${" + eventsFnID + ".Arn}",
						"Payload": map[string]any{
							"phase": phase, "reclaimId.$": "$.reclaimId", "nodeId.$": "$.nodeId", "attempt.$": "$.attempt",
						},
					},
					"ResultPath":     nil,
					"TimeoutSeconds": float64(45),
					"Retry":          wantTaskRetry(),
				}
				if next == "" {
					task["End"] = true
				} else {
					task["Next"] = next
				}
				return task
			}
			// A round step (stepfn.Step) to the steps queue, with the delay given, then Scheduled.
			queueID := queueID(t, tp, "capacity-"+tc.env+"-termination-steps")
			schedule := func(delay map[string]any, maxRounds [2]any) map[string]any {
				params := map[string]any{
					"QueueUrl": "${" + queueID + "}",
					"MessageBody": map[string]any{
						"step": "round", "reclaimId.$": "$.reclaimId", "nodeId.$": "$.nodeId", "attempt.$": "$.attempt",
						"round.$": "$.round", "vmIds.$": "$.vmIds", "dueAt.$": "$.dueAt", maxRounds[0].(string): maxRounds[1],
					},
				}
				maps.Copy(params, delay)
				return map[string]any{
					"Type":       "Task",
					"Resource":   "arn:${AWS::Partition}:states:::sqs:sendMessage",
					"Parameters": params,
					"Retry": []any{map[string]any{
						"ErrorEquals": []any{"States.ALL"}, "IntervalSeconds": float64(1), "BackoffRate": float64(2), "MaxAttempts": float64(4),
					}},
					"Next": "Scheduled",
				}
			}
			fnID, _ := functionByName(t, tp, tc.env, "terminate-node")
			for name, want := range map[string]map[string]any{
				// The first step from the API or the reconciler, a round from the queue.
				"Step?": {
					"Type":    "Choice",
					"Choices": []any{map[string]any{"Variable": "$.step", "StringEquals": "round", "Next": "TerminateNode"}},
					"Default": "NotifyAgents",
				},
				"Notify": publishTask("notice", "GraceLeft?"),
				// The agents' notices, on terminate-node (it alone opens agent keys): no retry (it
				// would come late), every error caught and passed on to Notify as success is, so
				// the notices never hold the termination; the function bounds its own calls by
				// terminateAfter.
				"NotifyAgents": {
					"Type":     "Task",
					"Resource": "arn:${AWS::Partition}:states:::lambda:invoke",
					"Parameters": map[string]any{
						"FunctionName": "${" + fnID + ".Arn}",
						"Payload": map[string]any{
							"agentNotices":     true,
							"reclaimId.$":      "$.reclaimId",
							"nodeId.$":         "$.nodeId",
							tc.executionArn[0]: tc.executionArn[1],
							"attempt.$":        "$.attempt",
						},
					},
					"ResultPath":     nil,
					"TimeoutSeconds": float64(50),
					"Catch":          []any{map[string]any{"ErrorEquals": []any{"States.ALL"}, "ResultPath": nil, "Next": "Notify"}},
					"Next":           "Notify",
				},
				"Report": publishTask("report", ""),
				// The grace left at start (rounded up) is the round's message delay; none: the round now.
				"GraceLeft?": {
					"Type":    "Choice",
					"Choices": []any{map[string]any{"Variable": "$.delaySeconds", "NumericGreaterThan": float64(0), "Next": "ScheduleRound"}},
					"Default": "TerminateNode",
				},
				"ScheduleRound": schedule(map[string]any{"DelaySeconds.$": "$.delaySeconds"}, [2]any{"maxRounds", float64(DefaultTerminateRounds)}),
				// Exactly this: no Catch, no ResultPath/ResultSelector, no other retrier.
				"TerminateNode": {
					"Type":     "Task",
					"Resource": "arn:${AWS::Partition}:states:::lambda:invoke",
					"Parameters": map[string]any{
						"FunctionName": "${" + fnID + ".Arn}",
						// The task, from the first step's input or a round step's.
						"Payload": map[string]any{
							"reclaimId.$":      "$.reclaimId",
							"nodeId.$":         "$.nodeId",
							"vmIds.$":          "$.vmIds",
							tc.executionArn[0]: tc.executionArn[1],
							"attempt.$":        "$.attempt",
							"round.$":          "$.round",
							"maxRounds":        float64(DefaultTerminateRounds),
							"retryWaitSeconds": tc.wait,
						},
					},
					"OutputPath":     "$.Payload", // the function's own result
					"TimeoutSeconds": float64(90),
					"Retry":          wantTaskRetry(),
					"Next":           "AllTerminated?",
				},
				"AllTerminated?": {
					"Type":    "Choice",
					"Choices": []any{map[string]any{"Variable": "$.done", "BooleanEquals": true, "Next": "Report"}},
					"Default": "ScheduleRetry",
				},
				"ScheduleRetry": schedule(map[string]any{"DelaySeconds": tc.wait}, [2]any{"maxRounds.$", "$.maxRounds"}),
				"Scheduled":     {"Type": "Succeed"},
			} {
				if !reflect.DeepEqual(states[name], want) {
					t.Errorf("%s\n got %s\nwant %s", name, toJSON(states[name]), toJSON(want))
				}
			}
		})
	}
}

// The workflow reads its state by name: every path a state reads must be a field of what it
// reads it from: the first step's input (stepfn.Input), a round step from the queue
// (stepfn.Step), or a round's output (stepfn.Task). TerminateNode reads both steps; the
// Choice after it, ScheduleRetry and Report only a round's output.
func TestTerminationReadsWhatItsStateCarries(t *testing.T) {
	fieldsOf := func(v any) map[string]bool {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		fields := map[string]bool{}
		for k := range m {
			fields[k] = true
		}
		return fields
	}
	type carrier struct {
		name   string
		fields map[string]bool
	}
	input := carrier{"the first step's input", fieldsOf(stepfn.InputOf(capacity.Operation{ID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}}, time.Now()))}
	step := carrier{"a round step", fieldsOf(stepfn.Step{Step: stepfn.StepRound, ReclaimID: "rcl_1", NodeID: "n1", Attempt: 1, VMIDs: []string{"a"}, MaxRounds: 5})}
	// A round whose VM must be retried: the output the omitempty fields are absent from.
	output := carrier{"a round's output", fieldsOf(stepfn.RoundResult(stepfn.Task{RetryWaitSeconds: 2}, &capacity.TerminationReport{Next: capacity.TerminationTask{
		ReclaimID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}, Attempt: 1, Round: 1, MaxRounds: 5}}, time.Now()))}
	readFrom := map[string][]carrier{
		"Step?": {input, step}, "NotifyAgents": {input}, "Notify": {input}, "GraceLeft?": {input}, "ScheduleRound": {input},
		"TerminateNode": {input, step}, "AllTerminated?": {output}, "ScheduleRetry": {output}, "Report": {output}, "Scheduled": nil,
	}
	for _, env := range []string{"local", "prod"} {
		states := definition(t, synth(t, env), env)["States"].(map[string]any)
		if got, want := keysOf(states), slices.Sorted(maps.Keys(readFrom)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: states %v, want %v", env, got, want)
		}
		for name, state := range states {
			paths := statePaths(state)
			if name != "Scheduled" && len(paths) == 0 {
				t.Errorf("%s: %s reads no path of its state", env, name)
			}
			for _, path := range paths {
				field := strings.TrimPrefix(path, "$.")
				for _, from := range readFrom[name] {
					if !from.fields[field] {
						t.Errorf("%s: %s reads %s, which %s does not carry", env, name, path, from.name)
					}
				}
			}
		}
	}
}

// statePaths lists the paths of the state ("$.x") that a state definition reads: its
// Parameters' ".$" values, a Wait's TimestampPath, a Choice's Variables. Context object
// paths ("$$.") and the task's own result (OutputPath) are not the state's.
func statePaths(v any) []string {
	var paths []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(k, x)
			}
		case []any:
			for _, x := range v {
				walk(key, x)
			}
		case string:
			if (strings.HasSuffix(key, ".$") || key == "TimestampPath" || key == "Variable") && strings.HasPrefix(v, "$.") {
				paths = append(paths, v)
			}
		}
	}
	walk("", v)
	return paths
}

// wantTaskRetry is every workflow task's Retry: the platform errors of a Lambda invoke, then
// the function's own errors.
func wantTaskRetry() []any {
	return []any{map[string]any{
		"ErrorEquals": []any{
			"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
			"Lambda.TooManyRequestsException", "States.Timeout",
		},
		"IntervalSeconds": float64(1),
		"BackoffRate":     float64(2),
		"MaxAttempts":     float64(4),
	}, map[string]any{
		"ErrorEquals":     []any{"States.TaskFailed"},
		"IntervalSeconds": float64(2),
		"BackoffRate":     float64(2),
		"MaxAttempts":     float64(3),
	}}
}

// stateOrder follows a definition's top-level states from StartAt along Next (a Choice's:
// its first choice's) to the End.
func stateOrder(t *testing.T, def map[string]any) []string {
	t.Helper()
	states := def["States"].(map[string]any)
	var order []string
	for name, _ := def["StartAt"].(string); name != ""; {
		if slices.Contains(order, name) || len(order) > len(states) {
			t.Fatalf("states loop: %v then %s", order, name)
		}
		order = append(order, name)
		st, ok := states[name].(map[string]any)
		if !ok {
			t.Fatalf("state %s not defined", name)
		}
		next, _ := st["Next"].(string)
		if choices, _ := st["Choices"].([]any); len(choices) > 0 {
			next, _ = choices[0].(map[string]any)["Next"].(string)
		}
		if next == "" && st["End"] != true {
			t.Fatalf("state %s has neither Next nor End", name)
		}
		name = next
	}
	return order
}

func TestTerminationIsConfigurable(t *testing.T) {
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{
		Env: "prod", AssetRoot: testAssetRoot, TerminateRounds: 3, TerminateRetryWait: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	states := definition(t, tp, "prod")["States"].(map[string]any)
	payload := states["TerminateNode"].(map[string]any)["Parameters"].(map[string]any)["Payload"].(map[string]any)
	if payload["maxRounds"] != float64(3) {
		t.Errorf("maxRounds %v, want 3", payload["maxRounds"])
	}
	if payload["retryWaitSeconds"] != float64(7) {
		t.Errorf("retryWaitSeconds %v, want 7", payload["retryWaitSeconds"])
	}
	if retry := states["ScheduleRetry"].(map[string]any)["Parameters"].(map[string]any); retry["DelaySeconds"] != float64(7) {
		t.Errorf("ScheduleRetry DelaySeconds %v, want 7", retry["DelaySeconds"])
	}

	for _, bad := range []CapacityStackProps{
		{TerminateRounds: -1}, {TerminateRounds: 0.5}, {TerminateRetryWait: 1.5}, {TerminateRetryWait: 901},
	} {
		bad.Env, bad.AssetRoot = "prod", testAssetRoot
		app := awscdk.NewApp(nil)
		if s, err := NewCapacityStack(app, bad); err == nil || s != nil {
			t.Errorf("NewCapacityStack(%+v): want an error", bad)
		}
		if n := len(*app.Node().Children()); n != 0 {
			t.Errorf("NewCapacityStack(%+v) left %d constructs in the app", bad, n)
		}
	}
}
