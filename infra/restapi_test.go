package main

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/table"
)

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
			checkGoFunction(t, r, "api", 10)
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
			if got, want := toJSON(p["LoggingConfig"]), toJSON(wantLoggingConfig(lgID)); got != want {
				t.Errorf("LoggingConfig %s, want %s", got, want)
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
			// The web console's page and files, read-only.
			for _, r := range routes.Console {
				want[r.Path] = []string{"GET"}
			}
			if len(routes.Console) != 2 {
				t.Fatalf("console routes %v", routes.Console)
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
