package main

// Assertion tests on the synthesised template. They walk the template JSON in Go instead of
// using assertions.Template matchers, because a failed CDK assertion panics rather than fails.

import (
	"encoding/json"
	"fmt"
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

	"github.com/openrelay/capacity/shared/table"
)

// testAssetRoot holds a dummy api/bootstrap so that synth does not need `make lambdas`.
var testAssetRoot string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "capacity-infra-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, fn := range []string{"api"} {
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
	if len(tp.resources("AWS::DynamoDB::Table")) != 2 {
		t.Errorf("want 2 tables, got %d", len(tp.resources("AWS::DynamoDB::Table")))
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
				"STATE_TABLE":   ref(tableID(t, tp, table.State, tc.env)),
				"AUDIT_TABLE":   ref(tableID(t, tp, table.Audit, tc.env)),
				"APP_ENV":       tc.env,
				"LOG_LEVEL":     "info",
				"KEY_CACHE_TTL": "30s",
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

// TestApiFunctionPermissions: the API role may do exactly the listed DynamoDB actions on exactly
// the two table ARNs, write its own log group, and nothing else.
func TestApiFunctionPermissions(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			_, fn := apiFunction(t, tp, env)
			roleAtt, ok := props(fn)["Role"].(map[string]any)["Fn::GetAtt"].([]any)
			if !ok {
				t.Fatalf("function Role %s: want Fn::GetAtt of a role in the stack", toJSON(props(fn)["Role"]))
			}
			roleID := roleAtt[0].(string)
			role := tp.resources("AWS::IAM::Role")[roleID]
			if role == nil {
				t.Fatalf("role %s not in template", roleID)
			}
			rp := props(role)
			if rp["ManagedPolicyArns"] != nil {
				t.Errorf("role has managed policies %s", toJSON(rp["ManagedPolicyArns"]))
			}
			if trust := toJSON(rp["AssumeRolePolicyDocument"]); !strings.Contains(trust, `"Service":"lambda.amazonaws.com"`) {
				t.Errorf("trust policy %s", trust)
			}

			// Every statement that applies to the role: inline policies and attached AWS::IAM::Policy.
			var stmts []map[string]any
			for _, pol := range asList(rp["Policies"]) {
				if pol == nil {
					continue
				}
				for _, s := range asList(pol.(map[string]any)["PolicyDocument"].(map[string]any)["Statement"]) {
					stmts = append(stmts, s.(map[string]any))
				}
			}
			for _, pol := range tp.resources("AWS::IAM::Policy") {
				if !slices.ContainsFunc(asList(props(pol)["Roles"]), func(r any) bool { return reflect.DeepEqual(r, ref(roleID)) }) {
					continue
				}
				for _, s := range asList(props(pol)["PolicyDocument"].(map[string]any)["Statement"]) {
					stmts = append(stmts, s.(map[string]any))
				}
			}
			for _, mp := range tp.resources("AWS::IAM::ManagedPolicy") {
				if slices.ContainsFunc(asList(props(mp)["Roles"]), func(r any) bool { return reflect.DeepEqual(r, ref(roleID)) }) {
					t.Errorf("managed policy attached to the role: %s", toJSON(mp))
				}
			}

			// resource (as JSON) -> sorted actions
			got := map[string][]string{}
			for _, s := range stmts {
				if s["Effect"] != "Allow" || s["Condition"] != nil || s["NotAction"] != nil || s["NotResource"] != nil {
					t.Errorf("unexpected statement shape %s", toJSON(s))
				}
				for _, res := range asList(s["Resource"]) {
					if strings.Contains(toJSON(res), `*`) {
						t.Errorf("wildcard resource %s", toJSON(res))
					}
					for _, a := range asList(s["Action"]) {
						a := a.(string)
						if strings.Contains(a, "*") {
							t.Errorf("wildcard action %s", a)
						}
						got[toJSON(res)] = append(got[toJSON(res)], a)
					}
				}
			}
			for k := range got {
				sort.Strings(got[k])
			}
			lgID, _ := tp.one(t, "AWS::Logs::LogGroup", "LogGroupName", "/aws/lambda/capacity-"+env+"-api")
			want := map[string][]string{
				toJSON(getAtt(tableID(t, tp, table.State, env), "Arn")): {
					"dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem",
				},
				toJSON(getAtt(tableID(t, tp, table.Audit, env), "Arn")): {"dynamodb:PutItem"},
				toJSON(getAtt(lgID, "Arn")):                             {"logs:CreateLogStream", "logs:PutLogEvents"},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("role permissions\n got %v\nwant %v", got, want)
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
				if !strings.Contains(toJSON(integ["Uri"]), toJSON(getAtt(fnID, "Arn"))) {
					t.Errorf("%s %s: integration does not target the api function: %s", p["HttpMethod"], path, toJSON(integ["Uri"]))
				}
				if p["AuthorizationType"] != "NONE" || p["AuthorizerId"] != nil {
					t.Errorf("%s %s: authorisation %v (the function authenticates itself)", p["HttpMethod"], path, p["AuthorizationType"])
				}
			}
			want := map[string][]string{
				"/v1/nodes/{nodeId}/reservations/{id}":                      {"ANY"},
				"/v1/nodes/{nodeId}/reservations/{id}/reclaim":              {"ANY"},
				"/v1/nodes/{nodeId}/reservations/{id}/release":              {"ANY"},
				"/v1/nodes/{nodeId}/vms":                                    {"ANY"},
				"/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}": {"ANY"},
			}
			if !reflect.DeepEqual(methods, want) {
				t.Errorf("methods by path\n got %v\nwant %v", methods, want)
			}
			if n := len(tp.resources("AWS::ApiGateway::Authorizer")); n != 0 {
				t.Errorf("%d authorisers, want none", n)
			}
			// API Gateway may invoke the function for each route.
			if n := len(tp.resources("AWS::Lambda::Permission")); n != len(want) {
				t.Errorf("%d lambda permissions, want %d", n, len(want))
			}

			_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", env)
			wantSettings := []any{map[string]any{
				"DataTraceEnabled":     false,
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
	if want := []string{"ApiFunctionName", "ApiUrl", "AuditTableName", "Env", "StateTableName"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("outputs %v, want %v", keys, want)
	}
	value := func(k string) any { return outs[k].(map[string]any)["Value"] }
	fnID, _ := apiFunction(t, tp, "local")
	for k, want := range map[string]any{
		"StateTableName":  ref(tableID(t, tp, table.State, "local")),
		"AuditTableName":  ref(tableID(t, tp, table.Audit, "local")),
		"ApiFunctionName": ref(fnID),
		"Env":             "local",
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
