package main

import (
	"reflect"
	"testing"
)

func TestReconcileSchedule(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			fnID, _ := functionByName(t, tp, env, "reconciler")
			// One rule on the default bus; the others are on the service's bus (TestReclaimRequestRule).
			var onDefault []string
			for id, r := range tp.resources("AWS::Events::Rule") {
				if props(r)["EventBusName"] == nil {
					onDefault = append(onDefault, id)
				}
			}
			if len(onDefault) != 1 {
				t.Fatalf("rules on the default bus %v, want 1", onDefault)
			}
			ruleID, rule := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+env+"-reconcile")
			p := props(rule)
			if p["ScheduleExpression"] != "rate(1 minute)" || p["State"] != "ENABLED" || p["EventPattern"] != nil || p["EventBusName"] != nil {
				t.Errorf("rule %s", toJSON(p))
			}
			wantTargets := []any{map[string]any{
				"Arn":         getAtt(fnID, "Arn"),
				"Id":          "Target0",
				"RetryPolicy": map[string]any{"MaximumEventAgeInSeconds": float64(60), "MaximumRetryAttempts": float64(0)},
			}}
			if !reflect.DeepEqual(p["Targets"], wantTargets) {
				t.Errorf("Targets %s, want %s", toJSON(p["Targets"]), toJSON(wantTargets))
			}
			var found int
			for _, perm := range tp.resources("AWS::Lambda::Permission") {
				pp := props(perm)
				if pp["Principal"] != "events.amazonaws.com" {
					continue
				}
				found++
				if !reflect.DeepEqual(pp["FunctionName"], getAtt(fnID, "Arn")) || !reflect.DeepEqual(pp["SourceArn"], getAtt(ruleID, "Arn")) ||
					pp["Action"] != "lambda:InvokeFunction" {
					t.Errorf("EventBridge permission %s", toJSON(pp))
				}
			}
			if found != 1 {
				t.Errorf("%d EventBridge lambda permissions, want 1", found)
			}
		})
	}
}
