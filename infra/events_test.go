package main

import (
	"reflect"
	"slices"
	"testing"
)

func eventBusID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::Events::EventBus", "Name", "capacity-"+env)
	return id
}

func queueID(t *testing.T, tp tmpl, name string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::SQS::Queue", "QueueName", name)
	return id
}

// schedulerRoleID is the logical id of the one role EventBridge Scheduler assumes.
func schedulerRoleID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	var ids []string
	for id, r := range tp.resources("AWS::IAM::Role") {
		if assumedBy(t, r) == "scheduler.amazonaws.com" {
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("%s: roles assumed by scheduler.amazonaws.com %v, want one", env, ids)
	}
	return ids[0]
}

// TestEventBus: each environment has its own bus, capacity-<env>, with no resource policy
// (only this account's principals, through IAM, may put events on it).
func TestEventBus(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			if n := len(tp.resources("AWS::Events::EventBus")); n != 1 {
				t.Errorf("%d buses, want 1", n)
			}
			eventBusID(t, tp, env)
			if n := len(tp.resources("AWS::Events::EventBusPolicy")); n != 0 {
				t.Errorf("%d bus policies, want none", n)
			}
		})
	}
}

// TestReclaimRequestRule: the rule on the bus sends the reclaim requests of the environment's
// allowed sources (cdk.json allowedEventSources), and of our own schedules, to the intake
// queue; EventBridge, for this rule only, may send to the queue.
func TestReclaimRequestRule(t *testing.T) {
	ctx := cdkJSONContext(t)
	type tc struct {
		name, env string
		allowed   []string // nil: as cdk.json configures env
		want      []any
	}
	cases := []tc{
		{"empty", "staging", []string{}, []any{ScheduleEventSource}},
		{"two", "prod", []string{"acme.billing", "openrelay.scheduler"}, []any{"acme.billing", "openrelay.scheduler", ScheduleEventSource}},
		{"schedule-listed", "dev", []string{ScheduleEventSource, "openrelay.scheduler"}, []any{ScheduleEventSource, "openrelay.scheduler"}},
	}
	for _, env := range allEnvs {
		// Every environment of cdk.json accepts the platform's scheduler today.
		cases = append(cases, tc{"cdk.json/" + env, env, nil, []any{"openrelay.scheduler", ScheduleEventSource}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := StackPropsFor(ctx[EnvironmentsContextKey], c.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.allowed != nil {
				p.AllowedEventSources = c.allowed
			}
			_, tp := synthProps(t, p)
			busID := eventBusID(t, tp, c.env)
			qID := queueID(t, tp, "capacity-"+c.env+"-reclaim-requests")
			ruleID, rule := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-reclaim-requests")
			rp := props(rule)
			wantPattern := map[string]any{"source": c.want, "detail-type": []any{ReclaimRequestedDetailType}}
			if !reflect.DeepEqual(rp["EventPattern"], wantPattern) {
				t.Errorf("EventPattern %s, want %s", toJSON(rp["EventPattern"]), toJSON(wantPattern))
			}
			if !reflect.DeepEqual(rp["EventBusName"], ref(busID)) || rp["State"] != "ENABLED" || rp["ScheduleExpression"] != nil {
				t.Errorf("rule %s: want enabled, on the bus %s", toJSON(rp), busID)
			}
			wantTargets := []any{map[string]any{"Arn": getAtt(qID, "Arn"), "Id": "Target0"}}
			if !reflect.DeepEqual(rp["Targets"], wantTargets) {
				t.Errorf("Targets %s, want %s", toJSON(rp["Targets"]), toJSON(wantTargets))
			}
			// Only rules of the service's bus: this one and the topology changes'
			// (TestTopologyRule). Every other is the reconciler's schedule.
			topologyID, _ := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-topology-changes")
			for id, r := range tp.resources("AWS::Events::Rule") {
				if id != ruleID && id != topologyID && props(r)["EventBusName"] != nil {
					t.Errorf("another rule on a bus: %s", toJSON(r))
				}
			}
			checkIntakeQueuePolicy(t, tp, qID, ruleID, topologyID)
		})
	}
}

// checkIntakeQueuePolicy: the intake queue refuses plain http, and EventBridge may send to it
// for these rules only.
func checkIntakeQueuePolicy(t *testing.T, tp tmpl, qID string, ruleIDs ...string) {
	t.Helper()
	_, pol := tp.one(t, "AWS::SQS::QueuePolicy", "Queues", []any{ref(qID)})
	wantStatements := []any{denyInsecure(qID)}
	for _, ruleID := range ruleIDs {
		wantStatements = append(wantStatements, map[string]any{
			"Action":    []any{"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"},
			"Condition": map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": getAtt(ruleID, "Arn")}},
			"Effect":    "Allow",
			"Principal": map[string]any{"Service": "events.amazonaws.com"},
			"Resource":  getAtt(qID, "Arn"),
		})
	}
	if got := props(pol)["PolicyDocument"].(map[string]any)["Statement"]; !reflect.DeepEqual(got, wantStatements) {
		t.Errorf("queue policy\n got %s\nwant %s", toJSON(got), toJSON(wantStatements))
	}
}

// TestTopologyRule: Node Topology Changed events of the environment's topology sources
// (cdk.json topologyEventSources, default openrelay.fleet) go to the intake queue, and
// reclaim-events is told the same sources; with no source there is no rule, and the
// function accepts none.
func TestTopologyRule(t *testing.T) {
	ctx := cdkJSONContext(t)
	type tc struct {
		name, env string
		sources   []string // nil: as cdk.json configures env
		want      []any    // nil: no rule
		wantEnv   string
	}
	cases := []tc{
		{"two", "prod", []string{"acme.fleet", "openrelay.fleet"}, []any{"acme.fleet", "openrelay.fleet"}, "acme.fleet,openrelay.fleet"},
		{"none", "staging", []string{}, nil, ""},
	}
	for _, env := range []string{"local", "prod"} {
		cases = append(cases, tc{"cdk.json/" + env, env, nil, []any{"openrelay.fleet"}, "openrelay.fleet"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := StackPropsFor(ctx[EnvironmentsContextKey], c.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.sources != nil {
				p.TopologyEventSources = c.sources
			}
			_, tp := synthProps(t, p)
			qID := queueID(t, tp, "capacity-"+c.env+"-reclaim-requests")
			reclaimRuleID, _ := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-reclaim-requests")
			_, fn := functionByName(t, tp, c.env, "reclaim-events")
			if got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["TOPOLOGY_EVENT_SOURCES"]; got != c.wantEnv {
				t.Errorf("TOPOLOGY_EVENT_SOURCES %v, want %q", got, c.wantEnv)
			}
			var topology []string
			for id, r := range tp.resources("AWS::Events::Rule") {
				if props(r)["Name"] == "capacity-"+c.env+"-topology-changes" {
					topology = append(topology, id)
				}
			}
			if c.want == nil {
				if len(topology) != 0 {
					t.Errorf("topology rules %v, want none", topology)
				}
				checkIntakeQueuePolicy(t, tp, qID, reclaimRuleID)
				return
			}
			ruleID, rule := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-topology-changes")
			rp := props(rule)
			wantPattern := map[string]any{"source": c.want, "detail-type": []any{TopologyChangedDetailType}}
			if !reflect.DeepEqual(rp["EventPattern"], wantPattern) {
				t.Errorf("EventPattern %s, want %s", toJSON(rp["EventPattern"]), toJSON(wantPattern))
			}
			if !reflect.DeepEqual(rp["EventBusName"], ref(eventBusID(t, tp, c.env))) || rp["State"] != "ENABLED" {
				t.Errorf("rule %s: want enabled, on the service's bus", toJSON(rp))
			}
			wantTargets := []any{map[string]any{"Arn": getAtt(qID, "Arn"), "Id": "Target0"}}
			if !reflect.DeepEqual(rp["Targets"], wantTargets) {
				t.Errorf("Targets %s, want %s", toJSON(rp["Targets"]), toJSON(wantTargets))
			}
			checkIntakeQueuePolicy(t, tp, qID, reclaimRuleID, ruleID)
		})
	}
}

// denyInsecure is the queue policy statement of enforceSSL.
func denyInsecure(queueID string) map[string]any {
	return map[string]any{
		"Action":    "sqs:*",
		"Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}},
		"Effect":    "Deny",
		"Principal": map[string]any{"AWS": "*"},
		"Resource":  getAtt(queueID, "Arn"),
	}
}

// TestReclaimRequestQueues: the intake queue and its dead-letter queue, encrypted (SQS managed),
// TLS only, kept 14 days; after 5 receives a request goes to the dead-letter queue; the
// visibility timeout is 6 times reclaim-events' timeout.
func TestReclaimRequestQueues(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			if n := len(tp.resources("AWS::SQS::Queue")); n != 2 {
				t.Errorf("%d queues, want 2", n)
			}
			name := "capacity-" + env + "-reclaim-requests"
			qID, dlqID := queueID(t, tp, name), queueID(t, tp, name+"-dlq")
			_, fn := functionByName(t, tp, env, "reclaim-events")
			timeout := props(fn)["Timeout"].(float64)
			if timeout != reclaimEventsTimeoutSeconds {
				t.Errorf("reclaim-events Timeout %v, want %d", timeout, reclaimEventsTimeoutSeconds)
			}
			base := func(queue string) map[string]any {
				return map[string]any{
					"QueueName":              queue,
					"SqsManagedSseEnabled":   true,
					"MessageRetentionPeriod": float64(14 * 24 * 3600),
					"Tags":                   []any{map[string]any{"Key": "env", "Value": env}, map[string]any{"Key": "project", "Value": "capacity"}},
				}
			}
			wantQ := base(name)
			wantQ["VisibilityTimeout"] = 6 * timeout
			wantQ["RedrivePolicy"] = map[string]any{"deadLetterTargetArn": getAtt(dlqID, "Arn"), "maxReceiveCount": float64(5)}
			for id, want := range map[string]map[string]any{qID: wantQ, dlqID: base(name + "-dlq")} {
				if got := props(tp.resources("AWS::SQS::Queue")[id]); !reflect.DeepEqual(got, want) {
					t.Errorf("queue %s\n got %s\nwant %s", id, toJSON(got), toJSON(want))
				}
			}
			// The dead-letter queue's policy only refuses plain http: nothing sends to it but SQS's redrive.
			_, pol := tp.one(t, "AWS::SQS::QueuePolicy", "Queues", []any{ref(dlqID)})
			if got := props(pol)["PolicyDocument"].(map[string]any)["Statement"]; !reflect.DeepEqual(got, []any{denyInsecure(dlqID)}) {
				t.Errorf("dead-letter queue policy %s", toJSON(got))
			}
		})
	}
}

// TestReclaimEventsSource: reclaim-events reads the intake queue in batches of 10 and reports
// the failed items only, so that a batch's refusals and successes are not retried.
func TestReclaimEventsSource(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			esms := tp.resources("AWS::Lambda::EventSourceMapping")
			if len(esms) != 1 {
				t.Fatalf("%d event source mappings, want 1", len(esms))
			}
			fnID, _ := functionByName(t, tp, env, "reclaim-events")
			for _, m := range esms {
				want := map[string]any{
					"BatchSize":             float64(10),
					"EventSourceArn":        getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"),
					"FunctionName":          ref(fnID),
					"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
					"Tags":                  []any{map[string]any{"Key": "env", "Value": env}, map[string]any{"Key": "project", "Value": "capacity"}},
				}
				if got := props(m); !reflect.DeepEqual(got, want) {
					t.Errorf("event source mapping\n got %s\nwant %s", toJSON(got), toJSON(want))
				}
			}
		})
	}
}

// TestScheduler: the schedule group capacity-<env> (kept with the stack's data, since deleting
// it deletes its schedules) and the role EventBridge Scheduler assumes: only for this
// account's schedules, and only to put events on the bus.
func TestScheduler(t *testing.T) {
	for _, tc := range []struct{ env, deletion string }{{"local", "Delete"}, {"dev", "Delete"}, {"staging", "Retain"}, {"prod", "Retain"}} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			if n := len(tp.resources("AWS::Scheduler::ScheduleGroup")); n != 1 {
				t.Errorf("%d schedule groups, want 1", n)
			}
			_, g := tp.one(t, "AWS::Scheduler::ScheduleGroup", "Name", "capacity-"+tc.env)
			if g["DeletionPolicy"] != tc.deletion || g["UpdateReplacePolicy"] != tc.deletion {
				t.Errorf("group DeletionPolicy %v UpdateReplacePolicy %v, want %s", g["DeletionPolicy"], g["UpdateReplacePolicy"], tc.deletion)
			}
			if n := len(tp.resources("AWS::Scheduler::Schedule")); n != 0 {
				t.Errorf("%d schedules in the template: the api function makes them", n)
			}

			roleID := schedulerRoleID(t, tp, tc.env)
			role := props(tp.resources("AWS::IAM::Role")[roleID])
			wantTrust := map[string]any{
				"Statement": []any{map[string]any{
					"Action":    "sts:AssumeRole",
					"Condition": map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": ref("AWS::AccountId")}},
					"Effect":    "Allow",
					"Principal": map[string]any{"Service": "scheduler.amazonaws.com"},
				}},
				"Version": "2012-10-17",
			}
			if !reflect.DeepEqual(role["AssumeRolePolicyDocument"], wantTrust) {
				t.Errorf("trust policy\n got %s\nwant %s", toJSON(role["AssumeRolePolicyDocument"]), toJSON(wantTrust))
			}
			got := rolePermissions(t, tp, roleID, "scheduler.amazonaws.com")
			want := map[string][]string{toJSON(getAtt(eventBusID(t, tp, tc.env), "Arn")): {"events:PutEvents"}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("scheduler role permissions\n got %v\nwant %v", got, want)
			}
		})
	}
}

// TestEventsPublishers: exactly the functions that publish (reclaim-events, operation-events,
// the reconciler) know the bus by name; the api function knows it by ARN, as the schedules'
// target; nobody but the scheduler role and those three may put events.
func TestEventsPublishers(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			busID := eventBusID(t, tp, env)
			var named []string
			for _, r := range tp.resources("AWS::Lambda::Function") {
				vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
				if v, ok := vars["EVENT_BUS_NAME"]; ok {
					if !reflect.DeepEqual(v, ref(busID)) {
						t.Errorf("%v EVENT_BUS_NAME %s", props(r)["FunctionName"], toJSON(v))
					}
					named = append(named, props(r)["FunctionName"].(string))
				}
			}
			slices.Sort(named)
			if want := []string{"capacity-" + env + "-operation-events", "capacity-" + env + "-reclaim-events", "capacity-" + env + "-reconciler"}; !reflect.DeepEqual(named, want) {
				t.Errorf("functions with EVENT_BUS_NAME %v, want %v", named, want)
			}
			var publishers []string
			for id, role := range tp.resources("AWS::IAM::Role") {
				if id == apiGatewayCloudWatchRoleID(t, tp) {
					continue
				}
				for res, actions := range rolePermissions(t, tp, id, assumedBy(t, role), slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)...) {
					if slices.Contains(actions, "events:PutEvents") {
						if res != toJSON(getAtt(busID, "Arn")) {
							t.Errorf("role %s may put events on %s", id, res)
						}
						publishers = append(publishers, id)
					}
				}
			}
			if len(publishers) != 4 {
				t.Errorf("roles that may put events %v, want 4 (3 functions and the scheduler's)", publishers)
			}
		})
	}
}
