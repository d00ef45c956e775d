package main

import (
	"reflect"
	"testing"

	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/table"
)

// TestResourcesAreNamedByStackname: every function envvar declares is in the stack under
// stackname.Function (the name the local invoke command, the logs and the alarms' advice
// use; the floor in env local only), and no other function is; the tables are named by
// shared/table, the workflow and the bus by stackname.
func TestResourcesAreNamedByStackname(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			got := map[string]any{}
			for id, r := range tp.resources("AWS::Lambda::Function") {
				fn, _ := r["Metadata"].(map[string]any)["capacity:function"].(string)
				if fn == "" {
					t.Errorf("function %s has no capacity:function metadata", id)
				}
				got[fn] = props(r)["FunctionName"]
			}
			want := map[string]any{}
			for _, f := range envvar.Functions {
				if f.Name() != envvar.Floor.Name() || env == "local" {
					want[f.Name()] = stackname.Function(env, f.Name())
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("functions by folder %v, want %v", got, want)
			}
			for _, tb := range table.All {
				tp.one(t, "AWS::DynamoDB::Table", "TableName", tb.Name(env))
			}
			tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", stackname.Resource(env, "termination-express"))
			tp.one(t, "AWS::Events::EventBus", "Name", stackname.Stack(env))
		})
	}
}
