package main

import (
	"reflect"
	"slices"
	"testing"

	"github.com/openrelay/capacity/shared/table"
)

// checkGoFunction checks what goFunction makes of every function: the Go runtime on arm64,
// 256 MB, the timeout, and the metadata that names the package the local stack runner builds.
func checkGoFunction(t *testing.T, r map[string]any, name string, timeout float64) {
	t.Helper()
	p := props(r)
	memory := 256.0
	if name == "termination-steps" {
		memory = 128 // it only starts a run or sends a message: the smallest size bills least
	}
	for k, want := range map[string]any{
		"Runtime":       "provided.al2023",
		"Handler":       "bootstrap",
		"Architectures": []any{"arm64"},
		"MemorySize":    memory,
		"Timeout":       timeout,
	} {
		if !reflect.DeepEqual(p[k], want) {
			t.Errorf("%s = %s, want %s", k, toJSON(p[k]), toJSON(want))
		}
	}
	if md, _ := r["Metadata"].(map[string]any); md["capacity:function"] != name {
		t.Errorf("metadata capacity:function = %v, want %s", md["capacity:function"], name)
	}
}

// wantLoggingConfig is a function's in the test stacks (logLevel info): its own log group;
// JSON lines; Lambda's own INFO lines (START, END, REPORT) off; the function's lines filtered
// at INFO (TestFunctionLogLevels: by cdk.json's logLevel).
func wantLoggingConfig(logGroupID string) map[string]any {
	return map[string]any{"LogGroup": ref(logGroupID), "LogFormat": "JSON", "SystemLogLevel": "WARN", "ApplicationLogLevel": "INFO"}
}

func TestWorkerFunctions(t *testing.T) {
	for _, env := range []string{"local", "dev", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			want := 6
			if env == "local" {
				want++ // the floor (TestFloorOnlyLocally)
			}
			if n := len(tp.resources("AWS::Lambda::Function")); n != want {
				t.Errorf("%d functions, want %d", n, want)
			}
			state := ref(tableID(t, tp, table.State, env))
			terminateEnv := map[string]any{
				"STATE_TABLE": state, "AGENT_MASTER_SECRET_ID": ref(agentMasterSecretID(t, tp, env)), "AGENT_TIMEOUT": "5s",
				"AGENT_KEYS_KMS_KEY_ID": getAtt(agentKeysKeyID(t, tp), "Arn"),
			}
			if env == "local" {
				terminateEnv["AGENT_ALLOW_HTTP"] = "true"
			}
			for _, tc := range []struct {
				fn      string
				timeout float64
				env     map[string]any
			}{
				{"terminate-node", 60, terminateEnv},
				{"reconciler", 60, map[string]any{
					"STATE_TABLE": state, "STATE_MACHINE_ARN": ref(stateMachineID(t, tp, env)),
					"START_AFTER": "30s", "START_RATE": "200", "STUCK_AFTER": "15m", "HELD_AFTER": "1h", "EVENT_BUS_NAME": ref(eventBusID(t, tp, env)),
				}},
				{"reclaim-events", 60, map[string]any{
					"STATE_TABLE": state, "AUDIT_TABLE": ref(tableID(t, tp, table.Audit, env)),
					"KEYS_TABLE":        ref(tableID(t, tp, table.Keys, env)),
					"STATE_MACHINE_ARN": ref(stateMachineID(t, tp, env)), "EVENT_BUS_NAME": ref(eventBusID(t, tp, env)),
					"EVENT_PRINCIPALS": "[]", "EVENT_ACCOUNT": ref("AWS::AccountId"),
					"INTAKE_QUEUE_ARN": getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"),
					"INTAKE_QUEUE_URL": ref(queueID(t, tp, "capacity-"+env+"-reclaim-requests")),
				}},
				{"operation-events", 30, map[string]any{"STATE_TABLE": state, "EVENT_BUS_NAME": ref(eventBusID(t, tp, env))}},
				{"termination-steps", 30, map[string]any{
					"STATE_MACHINE_ARN":           ref(stateMachineID(t, tp, env)),
					"TERMINATION_STEPS_QUEUE_URL": ref(queueID(t, tp, "capacity-"+env+"-termination-steps")),
				}},
			} {
				t.Run(tc.fn, func(t *testing.T) {
					_, r := functionByName(t, tp, env, tc.fn)
					p := props(r)
					checkGoFunction(t, r, tc.fn, tc.timeout)
					tc.env["APP_ENV"], tc.env["LOG_LEVEL"] = env, "info"
					if got := p["Environment"].(map[string]any)["Variables"]; !reflect.DeepEqual(got, tc.env) {
						t.Errorf("Environment\n got %s\nwant %s", toJSON(got), toJSON(tc.env))
					}
					lgID := logGroupID(t, tp, "/aws/lambda/capacity-"+env+"-"+tc.fn)
					if got, want := toJSON(p["LoggingConfig"]), toJSON(wantLoggingConfig(lgID)); got != want {
						t.Errorf("LoggingConfig %s, want %s", got, want)
					}
				})
			}
		})
	}
}

// TestPlainHTTPAgentsOnlyLocally: AGENT_ALLOW_HTTP (the api function registers nodes with an
// http endpoint, terminate-node calls agents over http) is set on no function of any
// environment but local, whose agents are on loopback.
func TestPlainHTTPAgentsOnlyLocally(t *testing.T) {
	for _, env := range []string{"local", "dev", "staging", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			const variable = "AGENT_ALLOW_HTTP"
			var set []string
			for _, r := range tp.resources("AWS::Lambda::Function") {
				vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
				if v, ok := vars[variable]; ok {
					set = append(set, props(r)["FunctionName"].(string))
					if env != "local" || v != "true" {
						t.Errorf("function %v sets %s=%v in env %s", props(r)["FunctionName"], variable, v, env)
					}
				}
			}
			slices.Sort(set)
			if want := []string{"capacity-local-api", "capacity-local-terminate-node"}; env == "local" && !slices.Equal(set, want) {
				t.Errorf("local: functions with %s %v, want %v only", variable, set, want)
			}
		})
	}
}

// TestNoFunctionInjectsFaults: the fault layer (CAPACITY_FAULTS) is switched on only by the
// local stack runner, never by the stack: no function of any environment, local included,
// carries it or its seed.
func TestNoFunctionInjectsFaults(t *testing.T) {
	for _, env := range []string{"local", "dev", "staging", "prod"} {
		t.Run(env, func(t *testing.T) {
			fns := synth(t, env).resources("AWS::Lambda::Function")
			if len(fns) == 0 {
				t.Fatal("no functions synthesised")
			}
			for id, r := range fns {
				vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
				for _, k := range []string{"CAPACITY_FAULTS", "CAPACITY_FAULTS_SEED"} {
					if v, ok := vars[k]; ok {
						t.Errorf("function %s sets %s=%v in env %s", id, k, v, env)
					}
				}
			}
		})
	}
}
