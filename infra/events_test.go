package main

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
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

// TestEventBus: each environment has its own bus, capacity-<env>, whose policy proves every
// privileged source by its sender: an explicit Deny of PutEvents with that source to every
// principal but its configured roles (the service's own source: the publishing functions;
// the schedules': the scheduler role; each event principal's: its senderRoles).
func TestEventBus(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			p, err := StackPropsFor(cdkJSONContext(t)[EnvironmentsContextKey], env)
			if err != nil {
				t.Fatal(err)
			}
			_, tp := synthProps(t, p)
			if n := len(tp.resources("AWS::Events::EventBus")); n != 1 {
				t.Errorf("%d buses, want 1", n)
			}
			busID := eventBusID(t, tp, env)
			account := map[string]string{"local": "000000000000", "dev": "111111111111", "staging": "222222222222", "prod": "333333333333"}[env]
			var publishers []any
			for _, fn := range []string{"operation-events", "reconciler", "reclaim-events"} {
				_, r := functionByName(t, tp, env, fn)
				publishers = append(publishers, props(r)["Role"])
			}
			want := map[string]any{
				capacity.SourceCapacity:          publishers,
				capacity.SourceSchedule:          []any{getAtt(schedulerRoleID(t, tp, env), "Arn")},
				capacity.SourcePlatformScheduler: []any{"arn:aws:iam::" + account + ":role/openrelay-marketplace-scheduler"},
				capacity.SourceFleet:             []any{"arn:aws:iam::" + account + ":role/openrelay-fleet-manager"},
			}
			got := busDenies(t, tp, busID)
			if toJSON(got) != toJSON(want) {
				t.Errorf("sources denied to all but their senders\n got %s\nwant %s", toJSON(got), toJSON(want))
			}
		})
	}
}

// busDenies reads the bus's policy statements: each must deny PutEvents on the bus to every
// principal but some roles, for one source; it returns those roles by source.
func busDenies(t *testing.T, tp tmpl, busID string) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, pol := range tp.resources("AWS::Events::EventBusPolicy") {
		p := props(pol)
		if !reflect.DeepEqual(p["EventBusName"], ref(busID)) {
			t.Errorf("a policy of another bus: %s", toJSON(p))
		}
		for _, st := range asList(p["Statement"]) {
			m := st.(map[string]any)
			cond, _ := m["Condition"].(map[string]any)
			source, _ := cond["StringEquals"].(map[string]any)["events:source"].(string)
			roles := cond["ArnNotEquals"].(map[string]any)["aws:PrincipalArn"]
			if m["Effect"] != "Deny" || toJSON(m["Principal"]) != `{"AWS":"*"}` || m["Action"] != "events:PutEvents" ||
				!reflect.DeepEqual(m["Resource"], getAtt(busID, "Arn")) || source == "" || roles == nil || len(cond) != 2 {
				t.Errorf("bus policy statement %s: want a Deny of PutEvents of one source to all but its roles", toJSON(m))
				continue
			}
			if _, dup := out[source]; dup {
				t.Errorf("source %s denied twice", source)
			}
			out[source] = roles
		}
	}
	return out
}

// withPrincipals is cdk.json's env, its eventPrincipals replaced by sources, each acting as
// platform with perms and sent by one role; nil perms: as cdk.json configures env.
func withPrincipals(t *testing.T, env string, perms map[string][]string) CapacityStackProps {
	t.Helper()
	p, err := StackPropsFor(cdkJSONContext(t)[EnvironmentsContextKey], env)
	if err != nil {
		t.Fatal(err)
	}
	if perms == nil {
		return p
	}
	p.EventPrincipals = []EventPrincipalConfig{}
	for _, src := range slices.Sorted(maps.Keys(perms)) {
		p.EventPrincipals = append(p.EventPrincipals, EventPrincipalConfig{
			EventPrincipal: capacity.EventPrincipal{Source: src, OrgID: "platform", Operator: true, Permissions: perms[src]},
			SenderRoles:    []string{"arn:aws:iam::333333333333:role/" + strings.ReplaceAll(src, ".", "-")},
		})
	}
	return p
}

// TestReclaimRequestRule: the rule on the bus sends the reclaim requests of the event
// principals that may reclaim (cdk.json eventPrincipals with reservation.capacity), and of our
// own schedules, to the intake queue; EventBridge, for this rule only, may send to the queue.
func TestReclaimRequestRule(t *testing.T) {
	type tc struct {
		name, env string
		perms     map[string][]string // nil: as cdk.json configures env
		want      []any
	}
	reclaim, topology := []string{capacity.PermCapacity}, []string{capacity.PermTopology}
	cases := []tc{
		{"none", "staging", map[string][]string{}, []any{capacity.SourceSchedule}},
		{"two", "prod", map[string][]string{"acme.billing": reclaim, "openrelay.scheduler": reclaim, "openrelay.fleet": topology},
			[]any{"acme.billing", "openrelay.scheduler", capacity.SourceSchedule}},
	}
	for _, env := range allEnvs {
		// Every environment of cdk.json accepts the platform's scheduler today.
		cases = append(cases, tc{"cdk.json/" + env, env, nil, []any{"openrelay.scheduler", capacity.SourceSchedule}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := withPrincipals(t, c.env, c.perms)
			_, tp := synthProps(t, p)
			busID := eventBusID(t, tp, c.env)
			qID := queueID(t, tp, "capacity-"+c.env+"-reclaim-requests")
			ruleID, rule := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-reclaim-requests")
			rp := props(rule)
			wantPattern := map[string]any{"source": c.want, "detail-type": []any{capacity.DetailReclaimRequested}}
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
			ruleIDs := []string{ruleID}
			for id, r := range tp.resources("AWS::Events::Rule") {
				switch {
				case props(r)["Name"] == "capacity-"+c.env+"-topology-changes":
					ruleIDs = append(ruleIDs, id)
				case id != ruleID && props(r)["EventBusName"] != nil:
					t.Errorf("another rule on a bus: %s", toJSON(r))
				}
			}
			checkIntakeQueuePolicy(t, tp, qID, ruleIDs...)
			// Every configured source is proven by its sender roles, whatever it may do.
			denied := busDenies(t, tp, busID)
			for _, ep := range p.EventPrincipals {
				if toJSON(denied[ep.Source]) != toJSON(ep.SenderRoles) {
					t.Errorf("source %s denied to all but %s, want all but %s", ep.Source, toJSON(denied[ep.Source]), ep.SenderRoles[0])
				}
			}
			if len(denied) != len(p.EventPrincipals)+2 {
				t.Errorf("%d sources in the bus policy, want the %d principals' and the service's two", len(denied), len(p.EventPrincipals))
			}
		})
	}
}

// checkIntakeQueuePolicy: the intake queue refuses plain http, and EventBridge may send to it
// for these rules only.
func checkIntakeQueuePolicy(t *testing.T, tp tmpl, qID string, ruleIDs ...string) {
	t.Helper()
	_, pol := tp.one(t, "AWS::SQS::QueuePolicy", "Queues", []any{ref(qID)})
	wantStatements := []any{denyInsecure(qID)}
	// EventBridge is allowed for those rules, and everything else denied (explicitly: an
	// identity policy of the account allowing sqs:SendMessage cannot override it).
	var rules []any
	for _, ruleID := range ruleIDs {
		rules = append(rules, getAtt(ruleID, "Arn"))
	}
	for _, ruleID := range ruleIDs {
		wantStatements = append(wantStatements, map[string]any{
			"Action":    []any{"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"},
			"Condition": map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": getAtt(ruleID, "Arn")}},
			"Effect":    "Allow",
			"Principal": map[string]any{"Service": "events.amazonaws.com"},
			"Resource":  getAtt(qID, "Arn"),
		})
	}
	wantStatements = append(wantStatements, denyAllBut(qID, rules))
	// Only reclaim-events' role (its event source mapping's poller) receives, so only a real
	// receive makes the receipt handles the function proves before acting.
	var role any // Fn::GetAtt of reclaim-events' role
	for _, r := range tp.resources("AWS::Lambda::Function") {
		if n, _ := props(r)["FunctionName"].(string); strings.HasSuffix(n, "-reclaim-events") {
			role = props(r)["Role"]
		}
	}
	wantStatements = append(wantStatements, map[string]any{
		"Action":    "sqs:ReceiveMessage",
		"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": []any{role}}},
		"Effect":    "Deny",
		"Principal": map[string]any{"AWS": "*"},
		"Resource":  getAtt(qID, "Arn"),
		"Sid":       "OnlyReclaimEventsReceives",
	})
	if got := props(pol)["PolicyDocument"].(map[string]any)["Statement"]; !reflect.DeepEqual(got, wantStatements) {
		t.Errorf("queue policy\n got %s\nwant %s", toJSON(got), toJSON(wantStatements))
	}
}

// TestTopologyRule: Node Topology Changed events of the event principals that may change
// topology (operator with node.topology) go to the intake queue; reclaim-events is told every
// principal (and refuses any other source); with no such principal there is no rule.
func TestTopologyRule(t *testing.T) {
	type tc struct {
		name, env string
		perms     map[string][]string // nil: as cdk.json configures env
		want      []any               // nil: no rule
	}
	reclaim, topology := []string{capacity.PermCapacity}, []string{capacity.PermTopology}
	cases := []tc{
		{"two", "prod", map[string][]string{"acme.fleet": topology, "openrelay.fleet": topology, "openrelay.scheduler": reclaim},
			[]any{"acme.fleet", "openrelay.fleet"}},
		{"none", "staging", map[string][]string{"openrelay.scheduler": reclaim}, nil},
	}
	for _, env := range []string{"local", "prod"} {
		cases = append(cases, tc{"cdk.json/" + env, env, nil, []any{"openrelay.fleet"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := withPrincipals(t, c.env, c.perms)
			_, tp := synthProps(t, p)
			qID := queueID(t, tp, "capacity-"+c.env+"-reclaim-requests")
			reclaimRuleID, _ := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-reclaim-requests")
			_, fn := functionByName(t, tp, c.env, "reclaim-events")
			// The function is told whom each source acts as, and nothing of the roles.
			told, err := capacity.ParseEventPrincipals(props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["EVENT_PRINCIPALS"].(string))
			if err != nil || len(told) != len(p.EventPrincipals) {
				t.Fatalf("EVENT_PRINCIPALS: %v, %v; want the %d configured", told, err, len(p.EventPrincipals))
			}
			for _, ep := range p.EventPrincipals {
				if got, _ := told.Lookup(ep.Source); !reflect.DeepEqual(got, ep.EventPrincipal) {
					t.Errorf("EVENT_PRINCIPALS %s = %+v, want %+v", ep.Source, got, ep.EventPrincipal)
				}
			}
			var topologyRules []string
			for id, r := range tp.resources("AWS::Events::Rule") {
				if props(r)["Name"] == "capacity-"+c.env+"-topology-changes" {
					topologyRules = append(topologyRules, id)
				}
			}
			if c.want == nil {
				if len(topologyRules) != 0 {
					t.Errorf("topology rules %v, want none", topologyRules)
				}
				checkIntakeQueuePolicy(t, tp, qID, reclaimRuleID)
				return
			}
			ruleID, rule := tp.one(t, "AWS::Events::Rule", "Name", "capacity-"+c.env+"-topology-changes")
			rp := props(rule)
			wantPattern := map[string]any{"source": c.want, "detail-type": []any{capacity.DetailTopologyChanged}}
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

// denyAllBut is the queue policy statement that denies sqs:SendMessage to all but rules.
func denyAllBut(queueID string, rules any) map[string]any {
	return map[string]any{
		"Action":    "sqs:SendMessage",
		"Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": rules}},
		"Effect":    "Deny",
		"Principal": map[string]any{"AWS": "*"},
		"Resource":  getAtt(queueID, "Arn"),
		"Sid":       "OnlyTheBusRulesSend",
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
			if n := len(tp.resources("AWS::SQS::Queue")); n != 4 {
				t.Errorf("%d queues, want 4 (the intake's and the termination steps', each with its dead letters)", n)
			}
			_, fn := functionByName(t, tp, env, "reclaim-events")
			_, dlqID := checkWorkQueue(t, tp, env, "capacity-"+env+"-reclaim-requests", fn, reclaimEventsTimeoutSeconds, 14)
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
			fnID, _ := functionByName(t, tp, env, "reclaim-events")
			_, m := tp.one(t, "AWS::Lambda::EventSourceMapping", "FunctionName", ref(fnID))
			{
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
			// The schedules' own source only: a schedule cannot pass for another principal.
			want := map[string][]string{publishAs(t, tp, tc.env, capacity.SourceSchedule): {"events:PutEvents"}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("scheduler role permissions\n got %v\nwant %v", got, want)
			}
		})
	}
}

// publishAs is the rolePermissions key of PutEvents on env's bus for events of source only.
func publishAs(t *testing.T, tp tmpl, env, source string) string {
	t.Helper()
	return toJSON(getAtt(eventBusID(t, tp, env), "Arn")) + " if " +
		toJSON(map[string]any{"StringEquals": map[string]any{"events:source": source}})
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
						// The functions publish as the service only; the scheduler role as the
						// schedules only (TestScheduler).
						source := capacity.SourceCapacity
						if assumedBy(t, role) == "scheduler.amazonaws.com" {
							source = capacity.SourceSchedule
						}
						if res != publishAs(t, tp, env, source) {
							t.Errorf("role %s may put events %s, want only %s", id, res, publishAs(t, tp, env, source))
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

// TestIntakeRoutesEveryInboundDetailType: the bus rules send to the intake queue exactly the
// detail types the service accepts (capacity.InboundDetailTypes), in every environment.
func TestIntakeRoutesEveryInboundDetailType(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synthConfigured(t, env)
			queue := getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn")
			var routed []string
			for _, r := range tp.resources("AWS::Events::Rule") {
				rp := props(r)
				targets := asList(rp["Targets"])
				if !slices.ContainsFunc(targets, func(t any) bool { return toJSON(t.(map[string]any)["Arn"]) == toJSON(queue) }) {
					continue
				}
				pattern, _ := rp["EventPattern"].(map[string]any)
				for _, dt := range asList(pattern["detail-type"]) {
					routed = append(routed, dt.(string))
				}
			}
			slices.Sort(routed)
			want := slices.Sorted(slices.Values(capacity.InboundDetailTypes))
			if !slices.Equal(routed, want) {
				t.Errorf("detail types routed to the intake %v, want %v", routed, want)
			}
		})
	}
}

// checkWorkQueue checks the queue name and its dead-letter queue "<name>-dlq" as workQueue
// makes them, consumed by fn: SQS-managed encryption, kept retentionDays, tagged, the
// visibility timeout 6 times fn's timeout (which must be wantTimeout), dead-lettered after 5
// receives. It returns the two queues' logical ids.
func checkWorkQueue(t *testing.T, tp tmpl, env, name string, fn map[string]any, wantTimeout, retentionDays float64) (qID, dlqID string) {
	t.Helper()
	qID, dlqID = queueID(t, tp, name), queueID(t, tp, name+"-dlq")
	timeout := props(fn)["Timeout"].(float64)
	if timeout != wantTimeout {
		t.Errorf("%s's consumer Timeout %v, want %v", name, timeout, wantTimeout)
	}
	base := func(queue string) map[string]any {
		return map[string]any{
			"QueueName":              queue,
			"SqsManagedSseEnabled":   true,
			"MessageRetentionPeriod": retentionDays * 24 * 3600,
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
	return qID, dlqID
}

// TestReclaimEventsInvokers: what the template proves of who runs reclaim-events. Its one
// trigger is the intake queue's event source mapping, which needs no resource policy (Lambda
// polls as the function's own role), and the function has none: no AWS::Lambda::Permission
// lets a service or another account invoke it. A principal of the account whose identity
// policy allows lambda:InvokeFunction can still invoke it (a function's resource policy can
// deny nobody): what it sends acts on nothing, as the function proves each record's receipt
// with the queue, and only its role may receive from the queue (TestReclaimRequestRule).
func TestReclaimEventsInvokers(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			fnID, _ := functionByName(t, tp, env, "reclaim-events")
			for id, p := range tp.resources("AWS::Lambda::Permission") {
				if strings.Contains(toJSON(props(p)["FunctionName"]), `"`+fnID+`"`) {
					t.Errorf("permission %s lets %s invoke reclaim-events", id, toJSON(props(p)["Principal"]))
				}
			}
			var sources []string
			for _, m := range tp.resources("AWS::Lambda::EventSourceMapping") {
				if reflect.DeepEqual(props(m)["FunctionName"], ref(fnID)) {
					sources = append(sources, toJSON(props(m)["EventSourceArn"]))
				}
			}
			want := []string{toJSON(getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"))}
			if !slices.Equal(sources, want) {
				t.Errorf("reclaim-events' event sources %v, want the intake queue %v", sources, want)
			}
		})
	}
}
