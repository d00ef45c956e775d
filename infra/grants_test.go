package main

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// roleOf returns the logical id of the role a resource (function, state machine) runs as.
func roleOf(t *testing.T, r map[string]any, prop string) string {
	t.Helper()
	att, ok := props(r)[prop].(map[string]any)["Fn::GetAtt"].([]any)
	if !ok {
		t.Fatalf("%s %s: want Fn::GetAtt of a role in the stack", prop, toJSON(props(r)[prop]))
	}
	return att[0].(string)
}

// rolePermissions returns what a role of the stack may do: resource (as JSON) -> sorted
// actions, over its inline policies and every AWS::IAM::Policy attached to it. It fails on
// managed policies, on statements other than Allow, on wildcard actions, and on wildcard
// resources except for the actions in starOK. A statement's condition is part of its key:
// resource + " if " + condition (as JSON).
func rolePermissions(t *testing.T, tp tmpl, roleID, service string, starOK ...string) map[string][]string {
	t.Helper()
	role := tp.resources("AWS::IAM::Role")[roleID]
	if role == nil {
		t.Fatalf("role %s not in template", roleID)
	}
	rp := props(role)
	if rp["ManagedPolicyArns"] != nil {
		t.Errorf("role has managed policies %s", toJSON(rp["ManagedPolicyArns"]))
	}
	if trust := toJSON(rp["AssumeRolePolicyDocument"]); !strings.Contains(trust, `"Service":"`+service+`"`) {
		t.Errorf("trust policy %s, want service %s", trust, service)
	}

	var stmts []map[string]any
	for _, pol := range asList(rp["Policies"]) {
		if pol == nil {
			continue
		}
		for _, s := range asList(pol.(map[string]any)["PolicyDocument"].(map[string]any)["Statement"]) {
			stmts = append(stmts, s.(map[string]any))
		}
	}
	attached := func(r map[string]any) bool {
		return slices.ContainsFunc(asList(props(r)["Roles"]), func(r any) bool { return reflect.DeepEqual(r, ref(roleID)) })
	}
	for _, pol := range tp.resources("AWS::IAM::Policy") {
		if !attached(pol) {
			continue
		}
		for _, s := range asList(props(pol)["PolicyDocument"].(map[string]any)["Statement"]) {
			stmts = append(stmts, s.(map[string]any))
		}
	}
	for _, mp := range tp.resources("AWS::IAM::ManagedPolicy") {
		if attached(mp) {
			t.Errorf("managed policy attached to the role: %s", toJSON(mp))
		}
	}

	got := map[string][]string{}
	for _, s := range stmts {
		if s["Effect"] != "Allow" && s["Effect"] != "Deny" || s["NotAction"] != nil || s["NotResource"] != nil {
			t.Errorf("unexpected statement shape %s", toJSON(s))
		}
		for _, res := range asList(s["Resource"]) {
			for _, a := range asList(s["Action"]) {
				a := a.(string)
				if strings.Contains(a, "*") {
					t.Errorf("wildcard action %s", a)
				}
				// A resource ending in ":*" after a function ARN is its versions and aliases.
				if r := toJSON(res); strings.Contains(strings.TrimSuffix(r, `":*"]]}`), `*`) && !slices.Contains(starOK, a) {
					t.Errorf("wildcard resource %s for %s", r, a)
				}
				key := toJSON(res)
				if s["Effect"] == "Deny" { // a role's explicit Deny narrows what it allows
					key = "deny " + key
				}
				if c := s["Condition"]; c != nil {
					key += " if " + toJSON(c)
				}
				got[key] = append(got[key], a)
			}
		}
	}
	for k := range got {
		sort.Strings(got[k])
	}
	return got
}

// TestRolePermissions: every role may do exactly the listed actions on exactly the listed
// resources, and nothing else; adding an action or a resource fails the test.
func TestRolePermissions(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			stateArn := toJSON(getAtt(tableID(t, tp, table.State, env), "Arn"))
			auditArn := toJSON(getAtt(tableID(t, tp, table.Audit, env), "Arn"))
			keysArn := toJSON(getAtt(tableID(t, tp, table.Keys, env), "Arn"))
			smArn := toJSON(ref(stateMachineID(t, tp, env)))
			masterSecretArn := toJSON(ref(agentMasterSecretID(t, tp, env))) // Ref of a secret is its ARN
			// The agent keys' KMS key, for agent keys only (purpose and a node id in the context).
			agentKeys := toJSON(getAtt(agentKeysKeyID(t, tp), "Arn")) + " if " + toJSON(map[string]any{
				"Null":         map[string]any{"kms:EncryptionContext:nodeId": "false"},
				"StringEquals": map[string]any{"kms:EncryptionContext:purpose": "capacity-agent-key"},
			})
			ownLogs := func(fn string) string {
				return toJSON(getAtt(logGroupID(t, tp, "/aws/lambda/capacity-"+env+"-"+fn), "Arn"))
			}
			logWrite := []string{"logs:CreateLogStream", "logs:PutLogEvents"}
			// Active tracing: X-Ray's actions support no resource-level permissions.
			traceWrite := []string{"xray:PutTelemetryRecords", "xray:PutTraceSegments"}
			// Publishing: on the service's bus, as the service only.
			busArn := publishAs(t, tp, env, capacity.SourceCapacity)
			publish := []string{"events:PutEvents"}
			queueArn := toJSON(getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"))
			stepsArn := toJSON(getAtt(queueID(t, tp, "capacity-"+env+"-termination-steps"), "Arn"))
			// The schedules of the environment's group, and no other group's.
			schedulesArn := toJSON(map[string]any{"Fn::Join": []any{"", []any{
				"arn:", ref("AWS::Partition"), ":scheduler:", ref("AWS::Region"), ":", ref("AWS::AccountId"),
				":schedule/capacity-" + env + "/*"}}})
			// The scheduler role, handed to EventBridge Scheduler only.
			passSchedulerRole := toJSON(getAtt(schedulerRoleID(t, tp, env), "Arn")) + " if " +
				toJSON(map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "scheduler.amazonaws.com"}})

			type roleCase struct {
				fn   string
				want map[string][]string
			}
			cases := []roleCase{
				{"api", map[string][]string{
					// BatchGetItem: an org's reservations list reads the reservations its
					// membership entry lists.
					stateArn: {"dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					// DeleteItem: a force-end moves its VM from the node's decision partition
					// (NODE#<id>) to its history, and no delete reaches any other partition.
					stateArn + " if " + toJSON(map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []any{"NODE#*"}}}):            {"dynamodb:DeleteItem"},
					"deny " + stateArn + " if " + toJSON(map[string]any{"ForAnyValue:StringLike": map[string]any{"dynamodb:LeadingKeys": []any{"NODE#*#*"}}}): {"dynamodb:DeleteItem"},
					// Append, read back a commit's own record after a lost answer (Store.Landed),
					// list a node's audit (Query) and a reservation's (its keys-only index, then
					// the page's records by BatchGetItem).
					auditArn: {"dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"},
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.Audit, env), "Arn"), "/index/" + table.AuditByReservationIndex}}}): {"dynamodb:Query"},
					// A reservation's scheduled reclaims (the state table's byState index).
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.State, env), "Arn"), "/index/" + table.ByStateIndex}}}): {"dynamodb:Query"},
					// The node view's lists: nodes and a reservation's reclaims (the byList index).
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.State, env), "Arn"), "/index/byList"}}}): {"dynamodb:Query"},
					// Key lookup and management; never DeleteItem.
					keysArn: {"dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Scan", "dynamodb:UpdateItem"},
					// Each key's rate limiter: one conditional update of its bucket.
					toJSON(getAtt(tableID(t, tp, table.Limits, env), "Arn")): {"dynamodb:UpdateItem"},
					// Seals the agent keys it makes; opens none, reads no master secret.
					agentKeys:         {"kms:Encrypt"},
					smArn:             {"states:StartExecution"},
					schedulesArn:      {"scheduler:CreateSchedule", "scheduler:DeleteSchedule", "scheduler:GetSchedule"},
					passSchedulerRole: {"iam:PassRole"},
					ownLogs("api"):    logWrite,
					`"*"`:             traceWrite,
				}},
				{"terminate-node", map[string][]string{
					// PutItem covers the node's resealed agent key too (NODE#<id>/NODE#AGENTKEY):
					// resealing needs no action more.
					stateArn:                  {"dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					masterSecretArn:           {"secretsmanager:GetSecretValue"},
					agentKeys:                 {"kms:Decrypt"},
					ownLogs("terminate-node"): logWrite,
					`"*"`:                     traceWrite,
				}},
				{"reconciler", map[string][]string{
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.State, env), "Arn"), "/index/byState"}}}): {"dynamodb:Query"},
					// Operation partitions only: no node, reservation, VM or idempotency item.
					// Its report claims too (put, update, delete); never DescribeExecution (an Express
					// run cannot be described).
					stateArn + " if " + toJSON(map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []any{"NODE#*#OP#*"}}}): {"dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					smArn:                 {"states:StartExecution"},
					busArn:                publish,
					ownLogs("reconciler"): logWrite,
					`"*"`:                 traceWrite,
				}},
				{"reclaim-events", map[string][]string{
					// The api function's reclaim grants, nothing of its schedules, and of the
					// keys only the read of a scheduled reclaim's creator key at its firing.
					stateArn: {"dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					keysArn:  {"dynamodb:GetItem"},
					auditArn: {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"},
					smArn:    {"states:StartExecution"},
					busArn:   publish,
					// The SQS event source's poller, on its own queue only.
					queueArn:                  {"sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage"},
					ownLogs("reclaim-events"): logWrite,
					`"*"`:                     traceWrite,
				}},
				{"termination-steps", map[string][]string{
					// The SQS event source's poller on its own queue, and the send of an early step back.
					stepsArn:                     {"sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"},
					smArn:                        {"states:StartExecution"},
					ownLogs("termination-steps"): logWrite,
					`"*"`:                        traceWrite,
				}},
				{"operation-events", map[string][]string{
					stateArn: {"dynamodb:GetItem", "dynamodb:Query"},
					// The report's claim and the operation's end after it, in operation partitions only.
					stateArn + " if " + toJSON(map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []any{"NODE#*#OP#*"}}}): {"dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:UpdateItem"},
					busArn:                      publish,
					ownLogs("operation-events"): logWrite,
					`"*"`:                       traceWrite,
				}},
			}
			if env == "local" { // only local has the floor (TestFloorOnlyLocally)
				cases = append(cases, roleCase{"floor", map[string][]string{
					stateArn:         {"dynamodb:ConditionCheckItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					auditArn:         {"dynamodb:PutItem"},
					smArn:            {"states:StartExecution"},
					ownLogs("floor"): logWrite,
					`"*"`:            traceWrite,
				}})
			}
			for _, tc := range cases {
				t.Run(tc.fn, func(t *testing.T) {
					_, fn := functionByName(t, tp, env, tc.fn)
					got := rolePermissions(t, tp, roleOf(t, fn, "Role"), "lambda.amazonaws.com", slices.Concat(traceWrite, schedulingActions)...)
					if !reflect.DeepEqual(got, tc.want) {
						t.Errorf("role permissions\n got %v\nwant %v", got, tc.want)
					}
				})
			}

			t.Run("state-machine", func(t *testing.T) {
				_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
				fnID, _ := functionByName(t, tp, env, "terminate-node")
				eventsFnID, _ := functionByName(t, tp, env, "operation-events")
				// Log delivery to CloudWatch Logs has no resource-level permissions: AWS
				// requires "*" for these (and CDK adds exactly them when logging is on).
				starOK := slices.Concat(logDeliveryActions, stateMachineTraceActions)
				got := rolePermissions(t, tp, roleOf(t, sm, "RoleArn"), "states.amazonaws.com", starOK...)
				want := map[string][]string{
					toJSON(getAtt(fnID, "Arn")): {"lambda:InvokeFunction"},
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(fnID, "Arn"), ":*"}}}): {"lambda:InvokeFunction"},
					toJSON(getAtt(eventsFnID, "Arn")):                                               {"lambda:InvokeFunction"},
					// ScheduleRound and ScheduleRetry, to the steps queue only.
					stepsArn: {"sqs:SendMessage"},
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(eventsFnID, "Arn"), ":*"}}}): {"lambda:InvokeFunction"},
					`"*"`: starOK,
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("state machine role permissions\n got %v\nwant %v", got, want)
				}
			})
		})
	}
}

// schedulingActions act on the schedules of one group (schedule/capacity-<env>/*): their names
// are scheduled reclaim ids, not known in advance.
var schedulingActions = []string{"scheduler:CreateSchedule", "scheduler:DeleteSchedule", "scheduler:GetSchedule"}

// logDeliveryActions: log delivery to CloudWatch Logs has no resource-level permissions, so
// AWS requires "*" for these (and CDK adds exactly them when a state machine logs).
var logDeliveryActions = []string{
	"logs:CreateLogDelivery", "logs:DeleteLogDelivery", "logs:DescribeLogGroups", "logs:DescribeResourcePolicies",
	"logs:GetLogDelivery", "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:UpdateLogDelivery",
}

// stateMachineTraceActions: what a traced state machine needs of X-Ray, which has no
// resource-level permissions either (functions need only the two Put actions).
var stateMachineTraceActions = []string{
	"xray:GetSamplingRules", "xray:GetSamplingTargets", "xray:PutTelemetryRecords", "xray:PutTraceSegments",
}

// assumedBy returns the service principal in a role's trust policy.
func assumedBy(t *testing.T, role map[string]any) string {
	t.Helper()
	for _, s := range asList(props(role)["AssumeRolePolicyDocument"].(map[string]any)["Statement"]) {
		if p, ok := s.(map[string]any)["Principal"].(map[string]any); ok {
			if svc, ok := p["Service"].(string); ok {
				return svc
			}
		}
	}
	t.Fatalf("role trust policy %s names no service", toJSON(props(role)["AssumeRolePolicyDocument"]))
	return ""
}

// TestEveryRoleIsAsserted: the stack has no role besides the ones TestRolePermissions pins
// down (the three functions' and the state machine's), so a new role cannot slip in unchecked.
func TestEveryRoleIsAsserted(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			asserted := map[string]string{}
			fns := []string{"api", "terminate-node", "reconciler", "reclaim-events", "operation-events", "termination-steps"}
			if env == "local" {
				fns = append(fns, "floor")
			}
			for _, fn := range fns {
				_, r := functionByName(t, tp, env, fn)
				asserted[roleOf(t, r, "Role")] = fn
			}
			_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
			asserted[roleOf(t, sm, "RoleArn")] = "state machine"
			// TestApiGatewayCloudWatchRole asserts the account's API Gateway logging role.
			asserted[apiGatewayCloudWatchRoleID(t, tp)] = "api gateway account"
			// TestSchedulerRole asserts the role EventBridge Scheduler assumes.
			asserted[schedulerRoleID(t, tp, env)] = "scheduler"
			for id := range tp.resources("AWS::IAM::Role") {
				if _, ok := asserted[id]; !ok {
					t.Errorf("role %s is not one whose permissions TestRolePermissions asserts", id)
				}
			}
			if len(asserted) != len(fns)+3 {
				t.Errorf("roles %v: want %d distinct roles (each function and the state machine its own, API Gateway's, the scheduler's)", asserted, len(fns)+3)
			}
		})
	}
}

// TestOnlyApiTouchesKeys: API keys decide who may do what, so no role of the stack but the
// api function's may write them (it manages them for operators), only reclaim-events may also
// read one (GetItem: a scheduled reclaim's firing checks its creator's key), none may delete
// one, and no role holds any DynamoDB action on "*". The rate limiters' table is the api
// function's alone, and only to UpdateItem a key's bucket (which also returns the stored state
// when its condition fails): no read, no delete, no other role.
func TestOnlyApiTouchesKeys(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			_, api := apiFunction(t, tp, env)
			_, firing := functionByName(t, tp, env, "reclaim-events")
			for _, tc := range []struct {
				spec    table.Table
				envVar  string
				allowed map[string][]string // role -> its only actions on the table
				told    map[string]map[string]any
			}{
				{table.Keys, "KEYS_TABLE", map[string][]string{
					roleOf(t, api, "Role"):    {"dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Scan", "dynamodb:UpdateItem"},
					roleOf(t, firing, "Role"): {"dynamodb:GetItem"},
				}, map[string]map[string]any{"api": api, "reclaim-events": firing}},
				{table.Limits, "LIMITS_TABLE", map[string][]string{
					roleOf(t, api, "Role"): {"dynamodb:UpdateItem"},
				}, map[string]map[string]any{"api": api}},
			} {
				tableID := tableID(t, tp, tc.spec, env)
				statements := map[string]int{}
				cwRole := apiGatewayCloudWatchRoleID(t, tp) // only a managed policy: TestApiGatewayCloudWatchRole
				for id, role := range tp.resources("AWS::IAM::Role") {
					if id == cwRole {
						continue
					}
					for res, actions := range rolePermissions(t, tp, id, assumedBy(t, role), slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)...) {
						if res == `"*"` {
							for _, a := range actions {
								if strings.HasPrefix(a, "dynamodb:") {
									t.Errorf("role %s: %s on every resource", id, a)
								}
							}
							continue
						}
						if !strings.Contains(res, `"`+tableID+`"`) {
							continue
						}
						if want, ok := tc.allowed[id]; !ok || !reflect.DeepEqual(actions, want) {
							t.Errorf("role %s: %v on the %s (%s); only %v may, each only its own of them", id, actions, tc.spec.LogicalID, res, tc.allowed)
							continue
						}
						statements[id]++
					}
				}
				for id := range tc.allowed {
					if statements[id] != 1 {
						t.Errorf("role %s uses the %s through %d statements, want 1", id, tc.spec.LogicalID, statements[id])
					}
				}
				// And the functions are told where to look.
				for name, fn := range tc.told {
					if got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)[tc.envVar]; !reflect.DeepEqual(got, ref(tableID)) {
						t.Errorf("%s %s = %s, want the %s %s", name, tc.envVar, toJSON(got), tc.spec.LogicalID, tableID)
					}
				}
			}
		})
	}
}
