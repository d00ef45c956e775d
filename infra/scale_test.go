package main

import (
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// TestScaleSettings: prod, as cdk.json configures it, warms the state table and each of its
// indexes, reserves the api function's concurrency, caps terminate-node's and sets the
// reconciler's start rate; an environment that sets none keeps DynamoDB's and Lambda's
// defaults (no warm throughput, no reserved concurrency) and the domain's start rate.
func TestScaleSettings(t *testing.T) {
	for _, tc := range []struct {
		env                 string
		warmWrite, warmRead any
		api, terminate      any
		startRate           string
	}{
		{"prod", 30000.0, 24000.0, 300.0, 200.0, "200"},
		{"staging", nil, nil, nil, nil, "200"},
		{"local", nil, nil, nil, nil, "200"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synthConfigured(t, tc.env)
			for _, spec := range table.All {
				_, r := tp.one(t, "AWS::DynamoDB::Table", "TableName", spec.Name(tc.env))
				warm, _ := props(r)["WarmThroughput"].(map[string]any)
				wantWrite, wantRead := tc.warmWrite, tc.warmRead
				if spec.LogicalID != table.State.LogicalID {
					wantWrite, wantRead = nil, nil
				}
				if warm["WriteUnitsPerSecond"] != wantWrite || warm["ReadUnitsPerSecond"] != wantRead {
					t.Errorf("table %s warm throughput %v, want writes %v reads %v", spec.Name(tc.env), warm, wantWrite, wantRead)
				}
				gsis, _ := props(r)["GlobalSecondaryIndexes"].([]any)
				for _, g := range gsis {
					g := g.(map[string]any)
					w, _ := g["WarmThroughput"].(map[string]any)
					if w["WriteUnitsPerSecond"] != wantWrite || w["ReadUnitsPerSecond"] != wantRead {
						t.Errorf("index %s of %s warm throughput %v, want writes %v reads %v", g["IndexName"], spec.Name(tc.env), w, wantWrite, wantRead)
					}
				}
			}
			for fn, want := range map[string]any{"api": tc.api, "terminate-node": tc.terminate, "reconciler": nil} {
				_, r := tp.one(t, "AWS::Lambda::Function", "FunctionName", "capacity-"+tc.env+"-"+fn)
				if got := props(r)["ReservedConcurrentExecutions"]; got != want {
					t.Errorf("%s reserved concurrency %v, want %v", fn, got, want)
				}
			}
			_, r := tp.one(t, "AWS::Lambda::Function", "FunctionName", "capacity-"+tc.env+"-reconciler")
			vars := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
			if vars["START_RATE"] != tc.startRate {
				t.Errorf("reconciler START_RATE %v, want %s (default %d)", vars["START_RATE"], tc.startRate, capacity.DefaultStartRate)
			}
		})
	}
}

// TestScaleSettingsAreChecked: out-of-range scale settings fail the synth with a clear error.
func TestScaleSettingsAreChecked(t *testing.T) {
	for _, bad := range []map[string]any{
		{"warmWriteUnits": 100.0},
		{"warmReadUnits": 1.5e6},
		{"apiConcurrency": 0.0},
		{"terminateNodeConcurrency": 2.5},
		{"reconcilerStartRate": -1.0},
	} {
		envs := cdkJSONContext(t)[EnvironmentsContextKey].(map[string]any)
		prod := map[string]any{}
		for k, v := range envs["prod"].(map[string]any) {
			prod[k] = v
		}
		prod["scale"] = bad
		if _, err := StackPropsFor(map[string]any{"prod": prod}, "prod"); err == nil {
			t.Errorf("scale %v accepted", bad)
		}
	}
}
