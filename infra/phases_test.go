package main

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/stepfn"
)

// TestTerminationSendsEveryPhase: the workflow's tasks of operation-events send every phase
// of stepfn.Phases, each once, and no other (the function runs each one:
// functions/operation-events TestHandlerRunsEveryPhase); and their payloads hold only fields of
// stepfn.EventsTask, which the function reads.
func TestTerminationSendsEveryPhase(t *testing.T) {
	fields := map[string]bool{}
	for f := range reflect.TypeFor[stepfn.EventsTask]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		fields[name] = true
	}
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			eventsFn, _ := tp.one(t, "AWS::Lambda::Function", "FunctionName", stackname.Function(env, envvar.OperationEvents.Name()))
			var sent []string
			for state, s := range definition(t, tp, env)["States"].(map[string]any) {
				params, _ := s.(map[string]any)["Parameters"].(map[string]any)
				payload, _ := params["Payload"].(map[string]any)
				phase, ok := payload["phase"].(string)
				if !ok {
					continue
				}
				if fn, _ := json.Marshal(params["FunctionName"]); !strings.Contains(string(fn), eventsFn) {
					t.Errorf("state %s sends phase %q to %s, want operation-events", state, phase, fn)
				}
				sent = append(sent, phase)
				for key := range payload {
					if !fields[strings.TrimSuffix(key, ".$")] {
						t.Errorf("state %s: payload field %q is not one of stepfn.EventsTask's", state, key)
					}
				}
			}
			slices.Sort(sent)
			want := slices.Sorted(slices.Values(stepfn.Phases))
			if !slices.Equal(sent, want) {
				t.Errorf("phases sent %v, want stepfn.Phases %v", sent, want)
			}
		})
	}
}
