package main

// Assertion tests on the synthesised template. They walk the template JSON in Go instead of
// using assertions.Template matchers, because a failed CDK assertion panics rather than fails.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/stackoutput"
	"github.com/openrelay/capacity/shared/stepfn"
	"github.com/openrelay/capacity/shared/table"
)

// testAssetRoot holds a dummy <fn>/bootstrap per function so that synth does not need `make lambdas`.
var testAssetRoot string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "capacity-infra-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, f := range envvar.Functions {
			fn := f.Name()
			if err := os.MkdirAll(filepath.Join(dir, fn), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if err := os.WriteFile(filepath.Join(dir, fn, "bootstrap"), []byte("dummy"), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		testAssetRoot = dir
		return m.Run()
	}()
	jsii.Close()
	os.Exit(code)
}

// cdkJSONContext is the context of ../cdk.json (feature flags...), so that the tests
// synthesise what `cdk synth` does.
func cdkJSONContext(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("../cdk.json")
	if err != nil {
		t.Fatalf("read cdk.json: %v", err)
	}
	var c struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("cdk.json: %v", err)
	}
	return c.Context
}

type tmpl map[string]any

var synthCache = map[string]tmpl{}

// synth returns the template of the stack for env (synthesised once per env).
func synth(t *testing.T, env string) tmpl {
	t.Helper()
	if tp, ok := synthCache[env]; ok {
		return tp
	}
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{Env: env, AssetRoot: testAssetRoot})
	if err != nil {
		t.Fatalf("NewCapacityStack(%q): %v", env, err)
	}
	if got := *s.StackName(); got != "capacity-"+env {
		t.Errorf("stack name %q, want capacity-%s", got, env)
	}
	if !*awscdk.Token_IsUnresolved(s.Account()) || !*awscdk.Token_IsUnresolved(s.Region()) {
		t.Errorf("stack is not environment-agnostic: account %s region %s", *s.Account(), *s.Region())
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	synthCache[env] = tp
	return tp
}

// resources returns the template's resources of a type, by logical id.
func (tp tmpl) resources(typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range tp["Resources"].(map[string]any) {
		if r := r.(map[string]any); r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// one returns the single resource of a type whose property prop equals value.
func (tp tmpl) one(t *testing.T, typ, prop string, value any) (string, map[string]any) {
	t.Helper()
	var ids []string
	var found map[string]any
	for id, r := range tp.resources(typ) {
		if reflect.DeepEqual(props(r)[prop], value) {
			ids = append(ids, id)
			found = r
		}
	}
	if len(ids) != 1 {
		t.Fatalf("want one %s with %s=%v, found %v", typ, prop, value, ids)
	}
	return ids[0], found
}

func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

func ref(id string) any          { return map[string]any{"Ref": id} }
func getAtt(id, attr string) any { return map[string]any{"Fn::GetAtt": []any{id, attr}} }

// asList normalises a policy Action/Resource (a value or a list) to a list.
func asList(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestTables(t *testing.T) {
	for _, tc := range []struct {
		env      string
		deletion string // DeletionPolicy and UpdateReplacePolicy
		pitr     bool
	}{
		{"local", "Delete", false},
		{"dev", "Delete", false},
		{"prod", "Retain", true},
		{"staging", "Retain", true},
	} {
		for _, spec := range stackTables {
			t.Run(tc.env+"/"+spec.Suffix, func(t *testing.T) {
				tp := synth(t, tc.env)
				name := "capacity-" + tc.env + "-" + spec.Suffix
				if name != spec.Name(tc.env) {
					t.Fatalf("table.Name(%q) = %q, want %q", tc.env, spec.Name(tc.env), name)
				}
				id, r := tp.one(t, "AWS::DynamoDB::Table", "TableName", name)
				p := props(r)
				if !strings.HasPrefix(id, spec.LogicalID) {
					t.Errorf("logical id %s, want prefix %s", id, spec.LogicalID)
				}
				if p["BillingMode"] != "PAY_PER_REQUEST" {
					t.Errorf("BillingMode %v", p["BillingMode"])
				}
				wantKeys := []any{
					map[string]any{"AttributeName": "pk", "KeyType": "HASH"},
					map[string]any{"AttributeName": "sk", "KeyType": "RANGE"},
				}
				if !reflect.DeepEqual(p["KeySchema"], wantKeys) {
					t.Errorf("KeySchema %s", toJSON(p["KeySchema"]))
				}
				// Every key attribute (table and indexes) is a string.
				wantAttrs := map[string]string{table.PartitionKey: "S", table.SortKey: "S"}
				for _, ix := range spec.Indexes {
					wantAttrs[ix.PartitionKey], wantAttrs[ix.SortKey] = "S", "S"
				}
				gotAttrs := map[string]string{}
				for _, a := range asList(p["AttributeDefinitions"]) {
					a := a.(map[string]any)
					gotAttrs[a["AttributeName"].(string)] = a["AttributeType"].(string)
				}
				if !reflect.DeepEqual(gotAttrs, wantAttrs) {
					t.Errorf("AttributeDefinitions %v, want %v", gotAttrs, wantAttrs)
				}
				// Indexes: exactly those of shared/table, projection ALL.
				var wantGSIs []any
				for _, ix := range spec.Indexes {
					wantGSIs = append(wantGSIs, map[string]any{
						"IndexName": ix.Name,
						"KeySchema": []any{
							map[string]any{"AttributeName": ix.PartitionKey, "KeyType": "HASH"},
							map[string]any{"AttributeName": ix.SortKey, "KeyType": "RANGE"},
						},
						"Projection": map[string]any{"ProjectionType": "ALL"},
					})
				}
				gotGSIs, _ := p["GlobalSecondaryIndexes"].([]any)
				if !reflect.DeepEqual(gotGSIs, wantGSIs) {
					t.Errorf("GlobalSecondaryIndexes %s, want %s", toJSON(gotGSIs), toJSON(wantGSIs))
				}
				var wantTTL any
				if spec.TTL {
					wantTTL = map[string]any{"AttributeName": table.TTLAttribute, "Enabled": true}
				}
				if !reflect.DeepEqual(p["TimeToLiveSpecification"], wantTTL) {
					t.Errorf("TimeToLiveSpecification %s, want %s", toJSON(p["TimeToLiveSpecification"]), toJSON(wantTTL))
				}
				pitr := false
				if spec, ok := p["PointInTimeRecoverySpecification"].(map[string]any); ok {
					pitr = spec["PointInTimeRecoveryEnabled"] == true
				}
				if pitr != tc.pitr {
					t.Errorf("PITR %v, want %v", pitr, tc.pitr)
				}
				if got := p["DeletionProtectionEnabled"] == true; got != tc.pitr {
					t.Errorf("DeletionProtectionEnabled %v, want %v", got, tc.pitr)
				}
				if r["DeletionPolicy"] != tc.deletion || r["UpdateReplacePolicy"] != tc.deletion {
					t.Errorf("DeletionPolicy %v UpdateReplacePolicy %v, want %s", r["DeletionPolicy"], r["UpdateReplacePolicy"], tc.deletion)
				}
			})
		}
	}
}

// The literal contract with shared/table, in case it changes under us.
func TestStateTableHasByStateIndex(t *testing.T) {
	tp := synth(t, "local")
	_, r := tp.one(t, "AWS::DynamoDB::Table", "TableName", "capacity-local-state")
	gsis := toJSON(props(r)["GlobalSecondaryIndexes"])
	for _, s := range []string{`"IndexName":"byState"`, `"gsi1pk"`, `"gsi1sk"`} {
		if !strings.Contains(gsis, s) {
			t.Errorf("state table indexes %s lack %s", gsis, s)
		}
	}
	if n := len(tp.resources("AWS::DynamoDB::Table")); n != 4 {
		t.Errorf("want 4 tables (state, audit, keys, limits), got %d", n)
	}
}

func tableID(t *testing.T, tp tmpl, spec table.Table, env string) string {
	id, _ := tp.one(t, "AWS::DynamoDB::Table", "TableName", spec.Name(env))
	return id
}

func apiFunction(t *testing.T, tp tmpl, env string) (string, map[string]any) {
	t.Helper()
	return tp.one(t, "AWS::Lambda::Function", "FunctionName", "capacity-"+env+"-api")
}

func TestApiFunction(t *testing.T) {
	for _, tc := range []struct {
		env       string
		retention float64
		deletion  string
	}{
		{"local", 7, "Delete"},
		{"dev", 7, "Delete"},
		{"prod", 90, "Retain"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			_, r := apiFunction(t, tp, tc.env)
			p := props(r)
			for k, want := range map[string]any{
				"Runtime":       "provided.al2023",
				"Handler":       "bootstrap",
				"Architectures": []any{"arm64"},
				"MemorySize":    float64(256),
				"Timeout":       float64(10),
			} {
				if !reflect.DeepEqual(p[k], want) {
					t.Errorf("%s = %s, want %s", k, toJSON(p[k]), toJSON(want))
				}
			}
			if md, _ := r["Metadata"].(map[string]any); md["capacity:function"] != "api" {
				t.Errorf("metadata capacity:function = %v, want api", md["capacity:function"])
			}
			code, _ := p["Code"].(map[string]any)
			if code["S3Key"] == nil || code["ZipFile"] != nil {
				t.Errorf("Code %s: want an asset", toJSON(code))
			}
			wantEnv := map[string]any{
				"STATE_TABLE":       ref(tableID(t, tp, table.State, tc.env)),
				"AUDIT_TABLE":       ref(tableID(t, tp, table.Audit, tc.env)),
				"KEYS_TABLE":        ref(tableID(t, tp, table.Keys, tc.env)),
				"APP_ENV":           tc.env,
				"LOG_LEVEL":         "info",
				"KEY_CACHE_TTL":     "30s",
				"STATE_MACHINE_ARN": ref(stateMachineID(t, tp, tc.env)),
				"SCHEDULE_GROUP":    "capacity-" + tc.env,
				"SCHEDULE_ROLE_ARN": getAtt(schedulerRoleID(t, tp, tc.env), "Arn"),
				"EVENT_BUS_ARN":     getAtt(eventBusID(t, tp, tc.env), "Arn"),
				// The default cap on an org's pending scheduled reclaims.
				"MAX_PENDING_SCHEDULED_PER_ORG": "100",
				// Each key's rate limit (the default: props without one) and where it is kept.
				"LIMITS_TABLE":          ref(tableID(t, tp, table.Limits, tc.env)),
				"RATE_LIMIT_PER_SECOND": "50",
				"RATE_LIMIT_BURST":      "100",
				// Seals the agent keys it makes (and may open none).
				"AGENT_KEYS_KMS_KEY_ID": getAtt(agentKeysKeyID(t, tp), "Arn"),
			}
			if tc.env == "local" {
				wantEnv["AGENT_ALLOW_HTTP"] = "true"
			}
			gotEnv := p["Environment"].(map[string]any)["Variables"]
			if !reflect.DeepEqual(gotEnv, wantEnv) {
				t.Errorf("Environment %s, want %s", toJSON(gotEnv), toJSON(wantEnv))
			}
			// Its own log group, with retention.
			lgID, lg := tp.one(t, "AWS::Logs::LogGroup", "LogGroupName", "/aws/lambda/capacity-"+tc.env+"-api")
			if got := toJSON(p["LoggingConfig"]); got != toJSON(map[string]any{"LogGroup": ref(lgID)}) {
				t.Errorf("LoggingConfig %s, want log group %s", got, lgID)
			}
			if props(lg)["RetentionInDays"] != tc.retention {
				t.Errorf("RetentionInDays %v, want %v", props(lg)["RetentionInDays"], tc.retention)
			}
			if lg["DeletionPolicy"] != tc.deletion {
				t.Errorf("log group DeletionPolicy %v, want %s", lg["DeletionPolicy"], tc.deletion)
			}
		})
	}
}

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
		if s["Effect"] != "Allow" || s["NotAction"] != nil || s["NotResource"] != nil {
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

func functionByName(t *testing.T, tp tmpl, env, name string) (string, map[string]any) {
	t.Helper()
	return tp.one(t, "AWS::Lambda::Function", "FunctionName", "capacity-"+env+"-"+name)
}

func stateMachineID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination")
	return id
}

func logGroupID(t *testing.T, tp tmpl, name string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::Logs::LogGroup", "LogGroupName", name)
	return id
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
			// The reconciler asks what became of the state machine's executions, and nothing else's.
			executionsArn := toJSON(map[string]any{"Fn::Join": []any{"", []any{
				"arn:", ref("AWS::Partition"), ":states:", ref("AWS::Region"), ":", ref("AWS::AccountId"), ":execution:",
				getAtt(stateMachineID(t, tp, env), "Name"), ":*"}}})
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
					// DeleteItem: a force-end moves its VM to the node's history.
					stateArn: {"dynamodb:ConditionCheckItem", "dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					// Append, read back a commit's own record after a lost answer (Store.Landed),
					// list a node's audit (Query) and a reservation's (its index).
					auditArn: {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"},
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.Audit, env), "Arn"), "/index/" + table.AuditByReservationIndex}}}): {"dynamodb:Query"},
					// A reservation's scheduled reclaims (the state table's byState index).
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.State, env), "Arn"), "/index/" + table.ByStateIndex}}}): {"dynamodb:Query"},
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
					stateArn:                  {"dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"},
					masterSecretArn:           {"secretsmanager:GetSecretValue"},
					agentKeys:                 {"kms:Decrypt"},
					ownLogs("terminate-node"): logWrite,
					`"*"`:                     traceWrite,
				}},
				{"reconciler", map[string][]string{
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(tableID(t, tp, table.State, env), "Arn"), "/index/byState"}}}): {"dynamodb:Query"},
					// Operation partitions only: no node, reservation, VM or idempotency item.
					stateArn + " if " + toJSON(map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []any{"NODE#*#OP#*"}}}): {"dynamodb:Query", "dynamodb:UpdateItem"},
					smArn:                 {"states:StartExecution"},
					executionsArn:         {"states:DescribeExecution"},
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
				{"operation-events", map[string][]string{
					stateArn:                    {"dynamodb:GetItem", "dynamodb:Query"},
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
				_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination")
				fnID, _ := functionByName(t, tp, env, "terminate-node")
				eventsFnID, _ := functionByName(t, tp, env, "operation-events")
				// Log delivery to CloudWatch Logs has no resource-level permissions: AWS
				// requires "*" for these (and CDK adds exactly them when logging is on).
				starOK := slices.Concat(logDeliveryActions, stateMachineTraceActions)
				got := rolePermissions(t, tp, roleOf(t, sm, "RoleArn"), "states.amazonaws.com", starOK...)
				want := map[string][]string{
					toJSON(getAtt(fnID, "Arn")): {"lambda:InvokeFunction"},
					toJSON(map[string]any{"Fn::Join": []any{"", []any{getAtt(fnID, "Arn"), ":*"}}}):       {"lambda:InvokeFunction"},
					toJSON(getAtt(eventsFnID, "Arn")):                                                     {"lambda:InvokeFunction"},
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
			fns := []string{"api", "terminate-node", "reconciler", "reclaim-events", "operation-events"}
			if env == "local" {
				fns = append(fns, "floor")
			}
			for _, fn := range fns {
				_, r := functionByName(t, tp, env, fn)
				asserted[roleOf(t, r, "Role")] = fn
			}
			_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination")
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

func TestRoutes(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			apiID, _ := tp.one(t, "AWS::ApiGateway::RestApi", "Name", "capacity-"+env+"-api")
			fnID, _ := apiFunction(t, tp, env)
			// The function each path's methods must target: the api function, but for the floor.
			targetOf := func(path string) string {
				if path == FloorRoute {
					id, _ := functionByName(t, tp, env, "floor")
					return id
				}
				return fnID
			}

			// Full path of each AWS::ApiGateway::Resource, following ParentId to the root.
			res := tp.resources("AWS::ApiGateway::Resource")
			var pathOf func(id string, depth int) string
			pathOf = func(id string, depth int) string {
				p := props(res[id])
				parent := p["ParentId"]
				prefix := ""
				if reflect.DeepEqual(parent, getAtt(apiID, "RootResourceId")) {
					prefix = ""
				} else if m, ok := parent.(map[string]any); ok && m["Ref"] != nil && depth < 20 {
					prefix = pathOf(m["Ref"].(string), depth+1)
				} else {
					t.Fatalf("resource %s: unexpected parent %s", id, toJSON(parent))
				}
				return prefix + "/" + p["PathPart"].(string)
			}
			methods := map[string][]string{} // path -> HTTP methods
			for id, m := range tp.resources("AWS::ApiGateway::Method") {
				p := props(m)
				rid, ok := p["ResourceId"].(map[string]any)["Ref"].(string)
				if !ok {
					t.Errorf("method %s on the root resource", id)
					continue
				}
				path := pathOf(rid, 0)
				methods[path] = append(methods[path], p["HttpMethod"].(string))
				integ, _ := p["Integration"].(map[string]any)
				if integ["Type"] != "AWS_PROXY" || integ["IntegrationHttpMethod"] != "POST" {
					t.Errorf("%s %s: integration %s, want AWS_PROXY via POST", p["HttpMethod"], path, toJSON(integ))
				}
				if !strings.Contains(toJSON(integ["Uri"]), toJSON(getAtt(targetOf(path), "Arn"))) {
					t.Errorf("%s %s: integration does not target its function (%s): %s", p["HttpMethod"], path, targetOf(path), toJSON(integ["Uri"]))
				}
				if p["AuthorizationType"] != "NONE" || p["AuthorizerId"] != nil {
					t.Errorf("%s %s: authorisation %v (the function authenticates itself)", p["HttpMethod"], path, p["AuthorizationType"])
				}
			}
			// The gateway's paths are the route table's (the function's mux is built from it
			// too), each proxied with ANY; plus, locally, the floor.
			want := map[string][]string{}
			for _, r := range routes.All {
				want[r.Path] = []string{"ANY"}
			}
			if len(want) < 7 {
				t.Fatalf("route table has %d paths", len(want))
			}
			if env == "local" {
				want[FloorRoute] = []string{"POST"}
			}
			if !reflect.DeepEqual(methods, want) {
				t.Errorf("methods by path\n got %v\nwant %v", methods, want)
			}
			// Every resource with a method is a route: nothing is served that the table omits.
			for id := range res {
				path := pathOf(id, 0)
				if _, ok := want[path]; !ok && !slices.ContainsFunc(slices.Collect(maps.Keys(want)), func(w string) bool { return strings.HasPrefix(w, path+"/") }) {
					t.Errorf("API Gateway resource %s is neither a route nor on the way to one", path)
				}
			}
			if n := len(tp.resources("AWS::ApiGateway::Authorizer")); n != 0 {
				t.Errorf("%d authorisers, want none", n)
			}
			// API Gateway may invoke the function for each route (the floor only for its own).
			var apiPerms int
			for _, perm := range tp.resources("AWS::Lambda::Permission") {
				if props(perm)["Principal"] == "apigateway.amazonaws.com" {
					apiPerms++
					fn := props(perm)["FunctionName"]
					if !reflect.DeepEqual(fn, getAtt(fnID, "Arn")) && (env != "local" || !reflect.DeepEqual(fn, getAtt(targetOf(FloorRoute), "Arn"))) {
						t.Errorf("API Gateway may invoke %s", toJSON(fn))
					}
				}
			}
			if apiPerms != len(want) {
				t.Errorf("%d API Gateway lambda permissions, want %d", apiPerms, len(want))
			}

			_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", env)
			wantSettings := []any{map[string]any{
				"DataTraceEnabled":     false,
				"LoggingLevel":         "ERROR",
				"HttpMethod":           "*",
				"ResourcePath":         "/*",
				"ThrottlingBurstLimit": float64(DefaultThrottleBurst),
				"ThrottlingRateLimit":  float64(DefaultThrottleRate),
			}}
			if !reflect.DeepEqual(props(stage)["MethodSettings"], wantSettings) {
				t.Errorf("stage MethodSettings %s", toJSON(props(stage)["MethodSettings"]))
			}
		})
	}
}

// TestFloorOnlyLocally: the floor writes whatever it is sent, unauthenticated, so no
// environment but local has the function, its role or its route.
func TestFloorOnlyLocally(t *testing.T) {
	for _, env := range []string{"local", "dev", "staging", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			var floors []string
			for id, fn := range tp.resources("AWS::Lambda::Function") {
				if strings.Contains(toJSON(props(fn)["FunctionName"]), "floor") {
					floors = append(floors, id)
				}
			}
			var routes []string
			for id, r := range tp.resources("AWS::ApiGateway::Resource") {
				if props(r)["PathPart"] == "_floor" {
					routes = append(routes, id)
				}
			}
			if env == "local" {
				if len(floors) != 1 || len(routes) != 1 {
					t.Errorf("local: floor functions %v, _floor resources %v; want one each", floors, routes)
				}
				return
			}
			if len(floors) != 0 || len(routes) != 0 {
				t.Errorf("%s has the floor: functions %v, _floor resources %v", env, floors, routes)
			}
		})
	}
}

func TestThrottlingIsConfigurable(t *testing.T) {
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "prod", AssetRoot: testAssetRoot, ThrottleRate: 1000, ThrottleBurst: 2500})
	if err != nil {
		t.Fatal(err)
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", "prod")
	got := toJSON(props(stage)["MethodSettings"])
	if !strings.Contains(got, `"ThrottlingBurstLimit":2500`) || !strings.Contains(got, `"ThrottlingRateLimit":1000`) {
		t.Errorf("MethodSettings %s", got)
	}
}

func TestOutputs(t *testing.T) {
	tp := synth(t, "local")
	outs := tp["Outputs"].(map[string]any)
	var keys []string
	for k := range outs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{
		"AgentMasterSecretId", "AlarmTopicArn", "ApiFunctionName", "ApiUrl", "AuditTableName", "Env", "EventBusArn", "EventBusName",
		"KeysTableName", "OperationEventsFunctionName", "ReclaimEventsFunctionName", "ReclaimRequestsDeadLetterQueueUrl",
		"ReclaimRequestsQueueUrl", "ReconcilerFunctionName", "ScheduleGroupName", "StateMachineArn", "StateTableName", "TerminateNodeFunctionName",
	}; !reflect.DeepEqual(keys, want) {
		t.Errorf("outputs %v, want %v", keys, want)
	}
	if names := slices.Sorted(slices.Values(stackoutput.All)); !reflect.DeepEqual(keys, names) {
		t.Errorf("outputs %v, stackoutput.All %v", keys, names)
	}
	value := func(k string) any { return outs[k].(map[string]any)["Value"] }
	fnID, _ := apiFunction(t, tp, "local")
	terminateID, _ := functionByName(t, tp, "local", "terminate-node")
	reconcilerID, _ := functionByName(t, tp, "local", "reconciler")
	reclaimEventsID, _ := functionByName(t, tp, "local", "reclaim-events")
	operationEventsID, _ := functionByName(t, tp, "local", "operation-events")
	busID := eventBusID(t, tp, "local")
	for k, want := range map[string]any{
		"EventBusName":                      ref(busID), // Ref of a bus is its name
		"EventBusArn":                       getAtt(busID, "Arn"),
		"ReclaimRequestsQueueUrl":           ref(queueID(t, tp, "capacity-local-reclaim-requests")), // Ref of a queue is its URL
		"ReclaimRequestsDeadLetterQueueUrl": ref(queueID(t, tp, "capacity-local-reclaim-requests-dlq")),
		"ScheduleGroupName":                 "capacity-local",
		"ReclaimEventsFunctionName":         ref(reclaimEventsID),
		"OperationEventsFunctionName":       ref(operationEventsID),
		"StateTableName":                    ref(tableID(t, tp, table.State, "local")),
		"AuditTableName":                    ref(tableID(t, tp, table.Audit, "local")),
		"KeysTableName":                     ref(tableID(t, tp, table.Keys, "local")),
		"ApiFunctionName":                   ref(fnID),
		"StateMachineArn":                   ref(stateMachineID(t, tp, "local")),
		"TerminateNodeFunctionName":         ref(terminateID),
		"ReconcilerFunctionName":            ref(reconcilerID),
		"AgentMasterSecretId":               ref(agentMasterSecretID(t, tp, "local")),
		"AlarmTopicArn":                     ref(alarmTopicID(t, tp, "local")), // Ref of a topic is its ARN
		"Env":                               "local",
	} {
		if !reflect.DeepEqual(value(k), want) {
			t.Errorf("output %s = %s, want %s", k, toJSON(value(k)), toJSON(want))
		}
	}
	url := toJSON(value("ApiUrl"))
	apiID, _ := tp.one(t, "AWS::ApiGateway::RestApi", "Name", "capacity-local-api")
	stageID, _ := tp.one(t, "AWS::ApiGateway::Stage", "StageName", "local")
	for _, s := range []string{`"https://"`, toJSON(ref(apiID)), ".execute-api.", toJSON(ref(stageID))} {
		if !strings.Contains(url, s) {
			t.Errorf("ApiUrl %s lacks %s", url, s)
		}
	}
}

func TestValidateEnv(t *testing.T) {
	for _, tc := range []struct {
		env string
		ok  bool
	}{
		{"local", true}, {"dev", true}, {"prod", true}, {"pr-42", true}, {"ab", true},
		{"abcdefghijklmnop", true}, // 16 characters
		{"", false}, {"a", false}, {"Prod", false}, {"dev_1", false}, {"-dev", false},
		{"1dev", false}, {"dev.x", false}, {"dev x", false}, {"abcdefghijklmnopq", false},
	} {
		err := ValidateEnv(tc.env)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateEnv(%q) = %v, want ok=%v", tc.env, err, tc.ok)
		}
	}
}

func TestInvalidEnvIsRejected(t *testing.T) {
	for _, env := range []string{"Prod", "x", "dev_1", "../etc"} {
		app := awscdk.NewApp(nil)
		s, err := NewCapacityStack(app, CapacityStackProps{Env: env, AssetRoot: testAssetRoot})
		if err == nil || s != nil {
			t.Errorf("NewCapacityStack(%q) = %v, %v: want an error", env, s, err)
		}
		if n := len(*app.Node().Children()); n != 0 {
			t.Errorf("NewCapacityStack(%q) left %d constructs in the app", env, n)
		}
	}
}

func TestAgentMasterSecretByARNIsRejected(t *testing.T) {
	app := awscdk.NewApp(nil)
	arn := "arn:aws:secretsmanager:us-east-1:123456789012:secret:capacity/prod/agent-master-AbCdEf"
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "prod", AssetRoot: testAssetRoot, AgentMasterSecretName: arn})
	if err == nil || s != nil || !strings.Contains(err.Error(), "not its ARN") {
		t.Fatalf("NewCapacityStack with a secret ARN = %v, %v: want a clear error", s, err)
	}
}

func TestMissingLambdaBinaryIsAnError(t *testing.T) {
	app := awscdk.NewApp(nil)
	_, err := NewCapacityStack(app, CapacityStackProps{Env: "local", AssetRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make lambdas") {
		t.Errorf("err = %v, want a hint to run make lambdas", err)
	}
}

func TestConstructID(t *testing.T) {
	for in, want := range map[string]string{"api": "Api", "terminate-node": "TerminateNode", "reconciler": "Reconciler"} {
		if got := constructID(in); got != want {
			t.Errorf("constructID(%q) = %q, want %q", in, got, want)
		}
	}
}

// flatten renders a template value that holds a string (possibly an Fn::Join of strings and
// tokens) as one string, each token as a placeholder: ${AWS::Partition}, ${Id.Arn}, ${Id}.
func flatten(t *testing.T, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return v
	case map[string]any:
		if r, ok := v["Ref"].(string); ok && len(v) == 1 {
			return "${" + r + "}"
		}
		if a, ok := v["Fn::GetAtt"].([]any); ok && len(v) == 1 {
			return "${" + a[0].(string) + "." + a[1].(string) + "}"
		}
		if j, ok := v["Fn::Join"].([]any); ok && len(v) == 1 {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, flatten(t, p))
			}
			return strings.Join(parts, j[0].(string))
		}
	}
	t.Fatalf("cannot flatten %s", toJSON(v))
	return ""
}

// definition returns the state machine's ASL document, decoded.
func definition(t *testing.T, tp tmpl, env string) map[string]any {
	t.Helper()
	_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination")
	if props(sm)["Definition"] != nil || props(sm)["DefinitionS3Location"] != nil || props(sm)["DefinitionSubstitutions"] != nil {
		t.Fatalf("want the definition in DefinitionString only: %s", toJSON(props(sm)))
	}
	var def map[string]any
	if err := json.Unmarshal([]byte(flatten(t, props(sm)["DefinitionString"])), &def); err != nil {
		t.Fatalf("definition is not JSON: %v", err)
	}
	return def
}

// keysOf returns a JSON object's keys, sorted.
func keysOf(m any) []string {
	obj, _ := m.(map[string]any)
	return slices.Sorted(maps.Keys(obj))
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
			if p["StateMachineType"] != "STANDARD" {
				t.Errorf("StateMachineType %v, want STANDARD", p["StateMachineType"])
			}
			if n := len(tp.resources("AWS::StepFunctions::StateMachine")); n != 1 {
				t.Errorf("%d state machines, want 1", n)
			}
			lgID := logGroupID(t, tp, "/aws/vendedlogs/states/capacity-"+tc.env+"-termination")
			wantLogging := map[string]any{
				"Destinations":         []any{map[string]any{"CloudWatchLogsLogGroup": map[string]any{"LogGroupArn": getAtt(lgID, "Arn")}}},
				"IncludeExecutionData": true,
				"Level":                "ALL",
			}
			if !reflect.DeepEqual(p["LoggingConfiguration"], wantLogging) {
				t.Errorf("LoggingConfiguration %s, want %s", toJSON(p["LoggingConfiguration"]), toJSON(wantLogging))
			}
			lg := tp.resources("AWS::Logs::LogGroup")[lgID]
			if props(lg)["RetentionInDays"] != tc.retention || lg["DeletionPolicy"] != tc.deletion {
				t.Errorf("workflow log group retention %v deletion %v, want %v %s", props(lg)["RetentionInDays"], lg["DeletionPolicy"], tc.retention, tc.deletion)
			}

			def := definition(t, tp, tc.env)
			if def["StartAt"] != "Notify" || def["TimeoutSeconds"] != float64(3600) {
				t.Errorf("StartAt %v TimeoutSeconds %v, want Notify 3600", def["StartAt"], def["TimeoutSeconds"])
			}
			states := def["States"].(map[string]any)
			if got := keysOf(states); !reflect.DeepEqual(got, []string{"AllTerminated?", "BeforeNextRound", "GracePeriod", "Notify", "Report", "TerminateNode"}) {
				t.Fatalf("states %v", got)
			}
			// Notify -> GracePeriod -> TerminateNode -> AllTerminated? -> Report (End), or
			// -> BeforeNextRound -> TerminateNode.
			if got := stateOrder(t, def); !reflect.DeepEqual(got, []string{"Notify", "GracePeriod", "TerminateNode", "AllTerminated?", "Report"}) {
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
			fnID, _ := functionByName(t, tp, tc.env, "terminate-node")
			for name, want := range map[string]map[string]any{
				"Notify": publishTask("notice", "GracePeriod"),
				"Report": publishTask("report", ""),
				// Until the operation's terminateAfter (commit time plus grace; a past time waits not at all).
				"GracePeriod": {"Type": "Wait", "TimestampPath": "$.terminateAfter", "Next": "TerminateNode"},
				// Exactly this: no Catch, no ResultPath/ResultSelector, no other retrier.
				"TerminateNode": {
					"Type":     "Task",
					"Resource": "arn:${AWS::Partition}:states:::lambda:invoke",
					"Parameters": map[string]any{
						"FunctionName": "${" + fnID + ".Arn}",
						// The task, from the execution input in the first round, from the
						// previous round's output after.
						"Payload": map[string]any{
							"reclaimId.$":      "$.reclaimId",
							"nodeId.$":         "$.nodeId",
							"vmIds.$":          "$.vmIds",
							tc.executionArn[0]: tc.executionArn[1],
							"attempt.$":        "$.attempt",
							"round.$":          "$.round",
							"maxRounds":        float64(DefaultTerminateRounds),
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
					"Default": "BeforeNextRound",
				},
				"BeforeNextRound": {"Type": "Wait", "Seconds": tc.wait, "Next": "TerminateNode"},
			} {
				if !reflect.DeepEqual(states[name], want) {
					t.Errorf("%s\n got %s\nwant %s", name, toJSON(states[name]), toJSON(want))
				}
			}
		})
	}
}

// The workflow reads its state by name: every path a state reads must be a field of what it
// reads it from, the execution input (stepfn.Input) before the first round and a round's
// output (stepfn.Task) after. Report and the Choice read only round outputs; TerminateNode
// reads both.
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
	input := carrier{"the execution input", fieldsOf(stepfn.InputOf(capacity.Operation{ID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}}))}
	// A round whose VM must be retried: the output the omitempty fields are absent from.
	output := carrier{"a round's output", fieldsOf(stepfn.TaskOf(&capacity.TerminationReport{Next: capacity.TerminationTask{
		ReclaimID: "rcl_1", NodeID: "n1", VMIDs: []string{"a"}, Attempt: 1, Round: 1, MaxRounds: 5}}))}
	readFrom := map[string][]carrier{
		"Notify": {input}, "GracePeriod": {input}, "TerminateNode": {input, output},
		"AllTerminated?": {output}, "BeforeNextRound": {output}, "Report": {output},
	}
	for _, env := range []string{"local", "prod"} {
		states := definition(t, synth(t, env), env)["States"].(map[string]any)
		if got, want := keysOf(states), slices.Sorted(maps.Keys(readFrom)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: states %v, want %v", env, got, want)
		}
		for name, state := range states {
			paths := statePaths(state)
			if name != "BeforeNextRound" && len(paths) == 0 {
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
	if wait := states["BeforeNextRound"].(map[string]any); wait["Seconds"] != float64(7) {
		t.Errorf("Wait Seconds %v, want 7", wait["Seconds"])
	}

	for _, bad := range []CapacityStackProps{
		{TerminateRounds: -1}, {TerminateRounds: 0.5}, {TerminateRetryWait: 1.5}, {TerminateRetryWait: 4000},
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

func TestWorkerFunctions(t *testing.T) {
	for _, env := range []string{"local", "dev", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			want := 5
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
					"START_AFTER": "30s", "STUCK_AFTER": "15m", "HELD_AFTER": "1h", "EVENT_BUS_NAME": ref(eventBusID(t, tp, env)),
				}},
				{"reclaim-events", 60, map[string]any{
					"STATE_TABLE": state, "AUDIT_TABLE": ref(tableID(t, tp, table.Audit, env)),
					"KEYS_TABLE":        ref(tableID(t, tp, table.Keys, env)),
					"STATE_MACHINE_ARN": ref(stateMachineID(t, tp, env)), "EVENT_BUS_NAME": ref(eventBusID(t, tp, env)),
					"EVENT_PRINCIPALS": "[]", "EVENT_ACCOUNT": ref("AWS::AccountId"),
					"INTAKE_QUEUE_ARN": getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"),
				}},
				{"operation-events", 30, map[string]any{"STATE_TABLE": state, "EVENT_BUS_NAME": ref(eventBusID(t, tp, env))}},
			} {
				t.Run(tc.fn, func(t *testing.T) {
					_, r := functionByName(t, tp, env, tc.fn)
					p := props(r)
					for k, want := range map[string]any{
						"Runtime":       "provided.al2023",
						"Handler":       "bootstrap",
						"Architectures": []any{"arm64"},
						"MemorySize":    float64(256),
						"Timeout":       tc.timeout,
					} {
						if !reflect.DeepEqual(p[k], want) {
							t.Errorf("%s = %s, want %s", k, toJSON(p[k]), toJSON(want))
						}
					}
					if md, _ := r["Metadata"].(map[string]any); md["capacity:function"] != tc.fn {
						t.Errorf("metadata capacity:function = %v, want %s", md["capacity:function"], tc.fn)
					}
					tc.env["APP_ENV"], tc.env["LOG_LEVEL"] = env, "info"
					if got := p["Environment"].(map[string]any)["Variables"]; !reflect.DeepEqual(got, tc.env) {
						t.Errorf("Environment\n got %s\nwant %s", toJSON(got), toJSON(tc.env))
					}
					lgID := logGroupID(t, tp, "/aws/lambda/capacity-"+env+"-"+tc.fn)
					if got := toJSON(p["LoggingConfig"]); got != toJSON(map[string]any{"LogGroup": ref(lgID)}) {
						t.Errorf("LoggingConfig %s, want log group %s", got, lgID)
					}
				})
			}
		})
	}
}

// agentMasterSecretID is the logical id of the stack's agent master secret.
func agentMasterSecretID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::SecretsManager::Secret", "Name", "capacity/"+env+"/agent-master")
	return id
}

// TestAgentMasterSecret: the stack creates the master secret, generated (its value is in
// neither the template nor a function's configuration), kept outside local and dev.
func TestAgentMasterSecret(t *testing.T) {
	for _, tc := range []struct {
		env    string
		policy string
	}{{"local", "Delete"}, {"dev", "Delete"}, {"prod", "Retain"}} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			if n := len(tp.resources("AWS::SecretsManager::Secret")); n != 1 {
				t.Fatalf("%d secrets, want 1", n)
			}
			_, r := tp.one(t, "AWS::SecretsManager::Secret", "Name", "capacity/"+tc.env+"/agent-master")
			want := map[string]any{"ExcludePunctuation": true, "IncludeSpace": false, "PasswordLength": float64(64)}
			if got := props(r)["GenerateSecretString"]; !reflect.DeepEqual(got, want) {
				t.Errorf("GenerateSecretString %s, want %s", toJSON(got), toJSON(want))
			}
			if _, ok := props(r)["SecretString"]; ok {
				t.Error("the secret's value is in the template")
			}
			if r["DeletionPolicy"] != tc.policy || r["UpdateReplacePolicy"] != tc.policy {
				t.Errorf("DeletionPolicy %v UpdateReplacePolicy %v, want %s", r["DeletionPolicy"], r["UpdateReplacePolicy"], tc.policy)
			}
			all := toJSON(tp)
			for _, leak := range []string{"{{resolve:", "AGENT_SECRET\""} {
				if strings.Contains(all, leak) {
					t.Errorf("template contains %s", leak)
				}
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

// TestExistingAgentMasterSecret: given an existing secret's name, the stack creates none and
// terminate-node reads that one, by name, with GetSecretValue on its ARNs only.
func TestExistingAgentMasterSecret(t *testing.T) {
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "prod", AssetRoot: testAssetRoot, AgentMasterSecretName: "ops/agent-master"})
	if err != nil {
		t.Fatal(err)
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	if n := len(tp.resources("AWS::SecretsManager::Secret")); n != 0 {
		t.Errorf("%d secrets created, want 0", n)
	}
	// terminate-node alone (the keys of nodes still at generation 0).
	_, fn := functionByName(t, tp, "prod", "terminate-node")
	if got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["AGENT_MASTER_SECRET_ID"]; got != "ops/agent-master" {
		t.Errorf("terminate-node AGENT_MASTER_SECRET_ID = %s", toJSON(got))
	}
	got := rolePermissions(t, tp, roleOf(t, fn, "Role"), "lambda.amazonaws.com", slices.Concat(schedulingActions, []string{"xray:PutTelemetryRecords", "xray:PutTraceSegments"})...)
	arn := toJSON(map[string]any{"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:ops/agent-master-??????"})
	if !reflect.DeepEqual(got[arn], []string{"secretsmanager:GetSecretValue"}) {
		t.Errorf("terminate-node permissions %v, want GetSecretValue on %s", got, arn)
	}
	_, api := functionByName(t, tp, "prod", "api")
	for res, actions := range rolePermissions(t, tp, roleOf(t, api, "Role"), "lambda.amazonaws.com", slices.Concat(schedulingActions, []string{"xray:PutTelemetryRecords", "xray:PutTraceSegments"})...) {
		if slices.Contains(actions, "secretsmanager:GetSecretValue") {
			t.Errorf("api may read %s", res)
		}
	}
}

func agentKeysKeyID(t *testing.T, tp tmpl) string {
	t.Helper()
	for id, r := range tp.resources("AWS::KMS::Key") {
		if strings.Contains(toJSON(props(r)["Description"]), "agent") {
			return id
		}
	}
	t.Fatal("no agent keys KMS key")
	return ""
}

// TestApiCannotOpenAgentKeys: the internet-facing api function can seal a new node's agent key
// but obtain no existing one: no action of its role decrypts or re-encrypts under the agent
// keys' KMS key or reads any secret, the key's policy denies it those actions whatever its role
// says, and of all the stack's roles only terminate-node's may Decrypt (agent keys only). The
// key rotates and is kept with the stack's data.
func TestApiCannotOpenAgentKeys(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			keyID := agentKeysKeyID(t, tp)
			_, api := functionByName(t, tp, env, "api")
			apiRole := roleOf(t, api, "Role")
			_, tn := functionByName(t, tp, env, "terminate-node")
			tnRole := roleOf(t, tn, "Role")
			opening := []string{"kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:CreateGrant", "kms:Encrypt"}
			cwRole := apiGatewayCloudWatchRoleID(t, tp)
			for id, role := range tp.resources("AWS::IAM::Role") {
				if id == cwRole {
					continue
				}
				for res, actions := range rolePermissions(t, tp, id, assumedBy(t, role), slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)...) {
					for _, a := range actions {
						switch {
						case id == apiRole && (strings.HasPrefix(a, "secretsmanager:") || strings.HasPrefix(a, "kms:") && a != "kms:Encrypt"):
							t.Errorf("api role: %s on %s", a, res)
						case strings.HasPrefix(a, "kms:") && id != apiRole && !(id == tnRole && a == "kms:Decrypt"):
							t.Errorf("role %s: %s on %s; only terminate-node may open agent keys", id, a, res)
						case slices.Contains(opening, a) && !strings.Contains(res, `"`+keyID+`"`):
							t.Errorf("role %s: %s on %s, not the agent keys' key", id, a, res)
						}
					}
				}
			}
			vars := props(api)["Environment"].(map[string]any)["Variables"].(map[string]any)
			if _, ok := vars["AGENT_MASTER_SECRET_ID"]; ok {
				t.Error("the api function is told the agent master secret")
			}
			for name, fn := range map[string]map[string]any{"api": api, "terminate-node": tn} {
				got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["AGENT_KEYS_KMS_KEY_ID"]
				if !reflect.DeepEqual(got, getAtt(keyID, "Arn")) {
					t.Errorf("%s AGENT_KEYS_KMS_KEY_ID = %s", name, toJSON(got))
				}
			}

			// The key's own policy denies the api role every way to an agent key in clear.
			key := tp.resources("AWS::KMS::Key")[keyID]
			var denied []string
			for _, st := range asList(props(key)["KeyPolicy"].(map[string]any)["Statement"]) {
				st := st.(map[string]any)
				if st["Effect"] == "Deny" && reflect.DeepEqual(st["Principal"], map[string]any{"AWS": getAtt(apiRole, "Arn")}) {
					for _, a := range asList(st["Action"]) {
						denied = append(denied, a.(string))
					}
				}
			}
			for _, a := range []string{"kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey*", "kms:CreateGrant"} {
				if !slices.Contains(denied, a) {
					t.Errorf("the key policy does not deny the api role %s (denies %v)", a, denied)
				}
			}
			if props(key)["EnableKeyRotation"] != true {
				t.Error("the agent keys' key does not rotate")
			}
			want := map[string]string{"local": "Delete", "prod": "Retain"}[env]
			if key["DeletionPolicy"] != want {
				t.Errorf("DeletionPolicy %v, want %s", key["DeletionPolicy"], want)
			}
		})
	}
}

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

// TestPendingScheduledCapReachesTheApiFunction: the environment's cap on an org's pending
// scheduled reclaims is the api function's MAX_PENDING_SCHEDULED_PER_ORG.
func TestPendingScheduledCapReachesTheApiFunction(t *testing.T) {
	_, tp := synthProps(t, CapacityStackProps{Env: "staging", MaxPendingScheduledPerOrg: 7})
	_, r := apiFunction(t, tp, "staging")
	vars := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
	if got := vars["MAX_PENDING_SCHEDULED_PER_ORG"]; got != "7" {
		t.Errorf("MAX_PENDING_SCHEDULED_PER_ORG = %v, want 7", got)
	}
}

// The environment's per-key rate limit reaches the api function (RATE_LIMIT_PER_SECOND,
// RATE_LIMIT_BURST), as shared/config.RateLimit reads it.
func TestRateLimitSetting(t *testing.T) {
	_, tp := synthProps(t, CapacityStackProps{Env: "staging", RateLimit: capacity.RateLimit{PerSecond: 2.5, Burst: 7}})
	_, api := apiFunction(t, tp, "staging")
	vars := props(api)["Environment"].(map[string]any)["Variables"].(map[string]any)
	if vars["RATE_LIMIT_PER_SECOND"] != "2.5" || vars["RATE_LIMIT_BURST"] != "7" {
		t.Errorf("RATE_LIMIT_PER_SECOND %v, RATE_LIMIT_BURST %v; want 2.5 and 7", vars["RATE_LIMIT_PER_SECOND"], vars["RATE_LIMIT_BURST"])
	}
}
