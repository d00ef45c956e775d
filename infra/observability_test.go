package main

import (
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/emf"
)

var allEnvs = []string{"local", "dev", "staging", "prod"}

// synthProps synthesises a stack from explicit props (not cached).
func synthProps(t *testing.T, props CapacityStackProps) (*CapacityStack, tmpl) {
	t.Helper()
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	props.AssetRoot = testAssetRoot
	s, err := NewCapacityStack(app, props)
	if err != nil {
		t.Fatalf("NewCapacityStack(%q): %v", props.Env, err)
	}
	return s, tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
}

func apiGatewayCloudWatchRoleID(t *testing.T, tp tmpl) string {
	t.Helper()
	accounts := tp.resources("AWS::ApiGateway::Account")
	if len(accounts) != 1 {
		t.Fatalf("%d AWS::ApiGateway::Account, want 1", len(accounts))
	}
	for _, a := range accounts {
		return roleOf(t, a, "CloudWatchRoleArn")
	}
	return ""
}

func alarmTopicID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::SNS::Topic", "TopicName", "capacity-"+env+"-alarms")
	return id
}

// TestTracing: API Gateway, every function and the workflow send traces to X-Ray.
func TestTracing(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", env)
			if props(stage)["TracingEnabled"] != true {
				t.Errorf("stage TracingEnabled %v", props(stage)["TracingEnabled"])
			}
			fns := tp.resources("AWS::Lambda::Function")
			if len(fns) < 3 {
				t.Fatalf("%d functions", len(fns))
			}
			for id, fn := range fns {
				if got := toJSON(props(fn)["TracingConfig"]); got != `{"Mode":"Active"}` {
					t.Errorf("function %s TracingConfig %s, want Active", id, got)
				}
			}
			sm := tp.resources("AWS::StepFunctions::StateMachine")[stateMachineID(t, tp, env)]
			if got := toJSON(props(sm)["TracingConfiguration"]); got != `{"Enabled":true}` {
				t.Errorf("state machine TracingConfiguration %s", got)
			}
		})
	}
}

// TestApiLogs: the stage writes one JSON object per request to a log group of its own, and
// execution logs at ERROR without bodies.
func TestApiLogs(t *testing.T) {
	for _, tc := range []struct {
		env, deletion string
		retention     float64
	}{{"local", "Delete", 7}, {"dev", "Delete", 7}, {"staging", "Retain", 90}, {"prod", "Retain", 90}} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", tc.env)
			lgID := logGroupID(t, tp, "/aws/apigateway/capacity-"+tc.env+"-api-access")
			lg := tp.resources("AWS::Logs::LogGroup")[lgID]
			if props(lg)["RetentionInDays"] != tc.retention || lg["DeletionPolicy"] != tc.deletion {
				t.Errorf("access log group retention %v deletion %v, want %v %s", props(lg)["RetentionInDays"], lg["DeletionPolicy"], tc.retention, tc.deletion)
			}
			setting, _ := props(stage)["AccessLogSetting"].(map[string]any)
			if got, want := flatten(t, setting["DestinationArn"]), "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${"+lgID+"}"; got != want {
				t.Errorf("access log destination %s, want %s", got, want)
			}
			format, _ := setting["Format"].(string)
			var record map[string]any
			if err := json.Unmarshal([]byte(format), &record); err != nil {
				t.Fatalf("access log format is not JSON: %v\n%s", err, format)
			}
			for _, k := range []string{"requestId", "extendedRequestId", "xrayTraceId", "ip", "caller", "userAgent", "httpMethod",
				"resourcePath", "path", "status", "protocol", "responseLength", "requestTime", "responseLatency",
				"integrationLatency", "integrationStatus", "errorMessage"} {
				if v, _ := record[k].(string); !strings.HasPrefix(v, "$context.") {
					t.Errorf("access log %q = %v, want a $context variable", k, record[k])
				}
			}
			settings := asList(props(stage)["MethodSettings"])
			if len(settings) != 1 {
				t.Fatalf("MethodSettings %s", toJSON(settings))
			}
			ms := settings[0].(map[string]any)
			if ms["ResourcePath"] != "/*" || ms["HttpMethod"] != "*" || ms["LoggingLevel"] != "ERROR" || ms["DataTraceEnabled"] != false {
				t.Errorf("MethodSettings %s, want /*/* at ERROR without data trace", toJSON(ms))
			}
		})
	}
}

// TestApiGatewayCloudWatchRole: the account's API Gateway logging role has only the managed
// policy API Gateway documents, and outlives the stack (other APIs of the account rely on it).
func TestApiGatewayCloudWatchRole(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			id := apiGatewayCloudWatchRoleID(t, tp)
			role := tp.resources("AWS::IAM::Role")[id]
			if assumedBy(t, role) != "apigateway.amazonaws.com" {
				t.Errorf("role assumed by %s", assumedBy(t, role))
			}
			want := `[{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs"]]}]`
			if got := toJSON(props(role)["ManagedPolicyArns"]); got != want {
				t.Errorf("ManagedPolicyArns %s, want %s", got, want)
			}
			if props(role)["Policies"] != nil {
				t.Errorf("inline policies %s", toJSON(props(role)["Policies"]))
			}
			for _, pol := range tp.resources("AWS::IAM::Policy") {
				if slices.ContainsFunc(asList(props(pol)["Roles"]), func(r any) bool { return reflect.DeepEqual(r, ref(id)) }) {
					t.Errorf("policy attached: %s", toJSON(pol))
				}
			}
			if role["DeletionPolicy"] != "Retain" || role["UpdateReplacePolicy"] != "Retain" {
				t.Errorf("DeletionPolicy %v UpdateReplacePolicy %v, want Retain", role["DeletionPolicy"], role["UpdateReplacePolicy"])
			}
		})
	}
}

// TestAlarmTopic: one topic per environment, encrypted with a rotated key of its own that
// CloudWatch may use, TLS only, subscribed as cdk.json says.
func TestAlarmTopic(t *testing.T) {
	ctx := cdkJSONContext(t)
	type sub struct{ protocol, endpoint string }
	cases := []struct {
		name string
		env  string
		sub  string // "" = as cdk.json configures env
		want []sub
	}{
		{"local", "local", "", nil},
		{"dev", "dev", "", []sub{{"email", "capacity-alarms-dev@example.com"}}},
		{"prod", "prod", "", []sub{{"email", "capacity-alarms@example.com"}}},
		{"https", "staging", "https://hooks.example.com/alarms", []sub{{"https", "https://hooks.example.com/alarms"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			props0, err := StackPropsFor(ctx[EnvironmentsContextKey], tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if tc.sub != "" {
				props0.AlarmSubscription = tc.sub
			}
			_, tp := synthProps(t, props0)
			topicID := alarmTopicID(t, tp, tc.env)
			topic := props(tp.resources("AWS::SNS::Topic")[topicID])

			var got []sub
			for _, s := range tp.resources("AWS::SNS::Subscription") {
				p := props(s)
				if !reflect.DeepEqual(p["TopicArn"], ref(topicID)) {
					t.Errorf("subscription to %s", toJSON(p["TopicArn"]))
				}
				got = append(got, sub{p["Protocol"].(string), p["Endpoint"].(string)})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("subscriptions %v, want %v", got, tc.want)
			}

			// The topic's key (the other is the agent keys': TestApiCannotOpenAgentKeys).
			keys := tp.resources("AWS::KMS::Key")
			delete(keys, agentKeysKeyID(t, tp))
			if len(keys) != 1 {
				t.Fatalf("%d KMS keys besides the agent keys', want 1", len(keys))
			}
			for keyID, key := range keys {
				if !reflect.DeepEqual(topic["KmsMasterKeyId"], getAtt(keyID, "Arn")) {
					t.Errorf("topic KmsMasterKeyId %s, want the key %s", toJSON(topic["KmsMasterKeyId"]), keyID)
				}
				if props(key)["EnableKeyRotation"] != true {
					t.Errorf("key rotation off")
				}
				policy := toJSON(props(key)["KeyPolicy"])
				if !strings.Contains(policy, `{"Action":["kms:Decrypt","kms:GenerateDataKey*"],"Condition":{"StringEquals":{"aws:SourceAccount":{"Ref":"AWS::AccountId"}}},"Effect":"Allow","Principal":{"Service":"cloudwatch.amazonaws.com"},"Resource":"*"`) {
					t.Errorf("key policy does not let CloudWatch encrypt: %s", policy)
				}
			}

			policies := tp.resources("AWS::SNS::TopicPolicy")
			if len(policies) != 1 {
				t.Fatalf("%d topic policies, want 1", len(policies))
			}
			for _, pol := range policies {
				doc := toJSON(props(pol)["PolicyDocument"])
				for _, want := range []string{
					`"Condition":{"Bool":{"aws:SecureTransport":"false"}},"Effect":"Deny"`,
					`"Principal":{"Service":"cloudwatch.amazonaws.com"}`,
				} {
					if !strings.Contains(doc, want) {
						t.Errorf("topic policy lacks %s: %s", want, doc)
					}
				}
			}
		})
	}
}

// wantAlarm is an alarm's metric and condition.
type wantAlarm struct {
	namespace, metric, statistic string
	period, periods, datapoints  float64
	op                           string
	threshold                    float64
}

func wantAlarms(env string) map[string]wantAlarm {
	const ge, gt = "GreaterThanOrEqualToThreshold", "GreaterThanThreshold"
	w := map[string]wantAlarm{
		"api-5xx-rate":             {"AWS/ApiGateway", "5XXError", "Average", 60, 5, 3, gt, 0.05},
		"api-p99-latency":          {"AWS/ApiGateway", "Latency", "p99", 300, 3, 2, gt, 3000},
		"termination-failed":       {"AWS/States", "ExecutionsFailed", "Sum", 300, 1, 1, ge, 1},
		"termination-timed-out":    {"AWS/States", "ExecutionsTimedOut", "Sum", 300, 1, 1, ge, 1},
		"stuck-reclaims":           {"Capacity", "StuckReclaimOperations", "Maximum", 300, 1, 1, ge, 1},
		"held-reclaims":            {"Capacity", "HeldReclaimOperations", "Maximum", 300, 1, 1, ge, 1},
		"reclaim-restarts":         {"Capacity", "RestartedReclaimOperations", "Sum", 900, 1, 1, ge, 1},
		"reclaim-starts-exhausted": {"Capacity", "ReclaimStartsExhausted", "Sum", 300, 1, 1, ge, 1},
		// The limiter failing open: 10 calls let through unchecked in 5 minutes.
		"rate-limit-unchecked": {"Capacity", "RateLimitUnchecked", "Sum", 300, 1, 1, ge, 10},
		// A record reclaim-events refused as not received from its queue: a direct invoke.
		"intake-records-refused": {"Capacity", "IntakeRecordsRefused", "Sum", 300, 1, 1, ge, 1},
		// The intake's dead-letter queue on its first message; its queue when a request waits 45 minutes.
		"reclaim-requests-dead-letters": {"AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum", 300, 1, 1, ge, 1},
		"reclaim-requests-age":          {"AWS/SQS", "ApproximateAgeOfOldestMessage", "Maximum", 300, 1, 1, ge, 2700},
		// The termination steps' dead-letter queue on its first message: a round that never ran.
		"termination-steps-dead-letters": {"AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum", 300, 1, 1, ge, 1},
		// Its queue when a step waits 20 minutes: a stalled consumer.
		"termination-steps-age": {"AWS/SQS", "ApproximateAgeOfOldestMessage", "Maximum", 300, 1, 1, ge, 1200},
	}
	fns := []string{"api", "terminate-node", "reconciler", "reclaim-events", "operation-events", "termination-steps"}
	if env == "local" {
		fns = append(fns, "floor")
	}
	for _, fn := range fns {
		w[fn+"-errors"] = wantAlarm{"AWS/Lambda", "Errors", "Sum", 300, 1, 1, ge, 1}
		w[fn+"-throttles"] = wantAlarm{"AWS/Lambda", "Throttles", "Sum", 300, 1, 1, ge, 1}
	}
	return w
}

// checkAlarm checks an alarm resource against want: its metric, its condition, and that it
// notifies the topic of both ALARM and OK, with no data not a breach.
func checkAlarm(t *testing.T, p map[string]any, w wantAlarm, topicID string) {
	t.Helper()
	stat := p["Statistic"]
	if stat == nil {
		stat = p["ExtendedStatistic"]
	}
	got := wantAlarm{p["Namespace"].(string), p["MetricName"].(string), stat.(string), p["Period"].(float64),
		p["EvaluationPeriods"].(float64), p["DatapointsToAlarm"].(float64), p["ComparisonOperator"].(string), p["Threshold"].(float64)}
	if got != w {
		t.Errorf("%v\n got %+v\nwant %+v", p["AlarmName"], got, w)
	}
	for _, k := range []string{"AlarmActions", "OKActions"} {
		if !reflect.DeepEqual(p[k], []any{ref(topicID)}) {
			t.Errorf("%v %s %s, want the alarm topic", p["AlarmName"], k, toJSON(p[k]))
		}
	}
	if p["TreatMissingData"] != "notBreaching" {
		t.Errorf("%v TreatMissingData %v", p["AlarmName"], p["TreatMissingData"])
	}
	if d, _ := p["AlarmDescription"].(string); len(d) < 40 {
		t.Errorf("%v description %q says too little", p["AlarmName"], d)
	}
}

// TestAlarms: exactly the expected alarms, each named capacity-<env>-<what>, on the right
// metric (the service's with Environment=<env>), notifying the environment's topic.
func TestAlarms(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			topicID := alarmTopicID(t, tp, env)
			want := wantAlarms(env)
			seen := map[string]bool{}
			for _, a := range tp.resources("AWS::CloudWatch::Alarm") {
				p := props(a)
				name, _ := p["AlarmName"].(string)
				what, ok := strings.CutPrefix(name, "capacity-"+env+"-")
				w, known := want[what]
				if !ok || !known {
					t.Errorf("unexpected alarm %q", name)
					continue
				}
				seen[what] = true
				checkAlarm(t, p, w, topicID)
				dims := map[string]any{}
				for _, d := range asList(p["Dimensions"]) {
					dims[d.(map[string]any)["Name"].(string)] = d.(map[string]any)["Value"]
				}
				switch w.namespace {
				case "Capacity":
					if !reflect.DeepEqual(dims, map[string]any{"Environment": env}) {
						t.Errorf("%s dimensions %v, want Environment=%s", name, dims, env)
					}
				case "AWS/ApiGateway":
					_, stage := tp.one(t, "AWS::ApiGateway::Stage", "StageName", env)
					_ = stage
					if dims["ApiName"] != "capacity-"+env+"-api" || dims["Stage"] == nil {
						t.Errorf("%s dimensions %v, want the API's stage", name, dims)
					}
				case "AWS/Lambda":
					fn := strings.TrimSuffix(strings.TrimSuffix(what, "-errors"), "-throttles")
					fnID, _ := functionByName(t, tp, env, fn)
					if !reflect.DeepEqual(dims, map[string]any{"FunctionName": ref(fnID)}) {
						t.Errorf("%s dimensions %v, want the function %s", name, dims, fnID)
					}
				case "AWS/SQS":
					queue := "capacity-" + env + "-reclaim-requests"
					switch what {
					case "reclaim-requests-dead-letters":
						queue += "-dlq"
					case "termination-steps-dead-letters":
						queue = "capacity-" + env + "-termination-steps-dlq"
					case "termination-steps-age":
						queue = "capacity-" + env + "-termination-steps"
					}
					if want := map[string]any{"QueueName": getAtt(queueID(t, tp, queue), "QueueName")}; !reflect.DeepEqual(dims, want) {
						t.Errorf("%s dimensions %v, want the queue %s", name, dims, queue)
					}
				case "AWS/States":
					if !reflect.DeepEqual(dims, map[string]any{"StateMachineArn": ref(stateMachineID(t, tp, env))}) {
						t.Errorf("%s dimensions %v, want the state machine", name, dims)
					}
				}
			}
			for what := range want {
				if !seen[what] {
					t.Errorf("no alarm capacity-%s-%s", env, what)
				}
			}
		})
	}
}

// TestDeadLetterAlarm: a dead-letter queue alarms on its first message.
func TestDeadLetterAlarm(t *testing.T) {
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "dev", AssetRoot: testAssetRoot})
	if err != nil {
		t.Fatal(err)
	}
	q := awssqs.NewQueue(s.Stack, jsii.String("TestDeadLetters"), nil)
	s.alarmOnDeadLetters(q, "intake")
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	_, a := tp.one(t, "AWS::CloudWatch::Alarm", "AlarmName", "capacity-dev-intake-dead-letters")
	checkAlarm(t, props(a), wantAlarm{"AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum", 300, 1, 1, "GreaterThanOrEqualToThreshold", 1},
		alarmTopicID(t, tp, "dev"))
	if s.Alarms["intake-dead-letters"] == nil {
		t.Error("alarm not in s.Alarms")
	}
}

// TestDashboard: one dashboard per environment, graphing the API, the service's metrics, the
// functions, the workflow and the reconciler, with the state of every alarm.
func TestDashboard(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			_, d := tp.one(t, "AWS::CloudWatch::Dashboard", "DashboardName", "capacity-"+env)
			body := flatten(t, props(d)["DashboardBody"])
			var parsed struct {
				Widgets []struct {
					Properties struct {
						Title   string
						Metrics []any
						Alarms  []any
					}
				}
			}
			// Tokens are rendered as ${...} placeholders inside JSON strings, so it still parses.
			if err := json.Unmarshal([]byte(body), &parsed); err != nil {
				t.Fatalf("dashboard body: %v\n%s", err, body)
			}
			var titles []string
			alarms := 0
			for _, w := range parsed.Widgets {
				titles = append(titles, w.Properties.Title)
				alarms += len(w.Properties.Alarms)
			}
			sort.Strings(titles)
			wantTitles := []string{"API 4xx / 5xx", "API latency", "API requests", "Alarms", "Function duration", "Function errors",
				"Function throttles", "Oldest reclaim request (s)", "Reclaim requests (queue)", "Reclaim to last termination", "Reclaims", "Reconciler",
				"Refusals by action and code", "Termination executions"}
			if !reflect.DeepEqual(titles, wantTitles) {
				t.Errorf("widgets %q, want %q", titles, wantTitles)
			}
			if want := len(wantAlarms(env)); alarms != want {
				t.Errorf("alarm widget shows %d alarms, want %d", alarms, want)
			}
			for _, s := range []string{
				`"Capacity","Reclaims","Environment","` + env + `"`,
				`"Capacity","ReclaimVictims","Environment","` + env + `"`,
				`"Capacity","ReclaimDryRuns","Environment","` + env + `"`,
				`"Capacity","ReclaimTerminationTime","Environment","` + env + `"`,
				`SEARCH('{Capacity,Action,Code,Environment} MetricName=\"Refusals\" Environment=\"` + env + `\"', 'Sum', 300)`,
				`"Capacity","StuckReclaimOperations","Environment","` + env + `"`,
				`"Capacity","HeldReclaimOperations","Environment","` + env + `"`,
				`"Capacity","HeldVMs","Environment","` + env + `"`,
				`"Capacity","RestartedReclaimOperations","Environment","` + env + `"`,
				`"AWS/States","ExecutionsStarted"`, `"AWS/States","ExecutionsSucceeded"`,
				`"AWS/Lambda","Duration"`, `"AWS/ApiGateway","Count"`, `"AWS/ApiGateway","4XXError"`,
				`"stat":"p99"`, `"stat":"p50"`,
				`"AWS/SQS","ApproximateNumberOfMessagesVisible","QueueName","${` + queueID(t, tp, "capacity-"+env+"-reclaim-requests") + `.QueueName}"`,
				`"AWS/SQS","ApproximateNumberOfMessagesVisible","QueueName","${` + queueID(t, tp, "capacity-"+env+"-reclaim-requests-dlq") + `.QueueName}"`,
				`"AWS/SQS","ApproximateAgeOfOldestMessage","QueueName","${` + queueID(t, tp, "capacity-"+env+"-reclaim-requests") + `.QueueName}"`,
			} {
				if !strings.Contains(body, s) {
					t.Errorf("dashboard lacks %s", s)
				}
			}
		})
	}
}

// TestAlarmThresholdsAreConfigurable: the API alarms take the environment's thresholds.
func TestAlarmThresholdsAreConfigurable(t *testing.T) {
	_, tp := synthProps(t, CapacityStackProps{Env: "staging", AlarmApiErrorRate: 0.01, AlarmApiP99Millis: 1500})
	topicID := alarmTopicID(t, tp, "staging")
	_, rate := tp.one(t, "AWS::CloudWatch::Alarm", "AlarmName", "capacity-staging-api-5xx-rate")
	checkAlarm(t, props(rate), wantAlarm{"AWS/ApiGateway", "5XXError", "Average", 60, 5, 3, "GreaterThanThreshold", 0.01}, topicID)
	_, p99 := tp.one(t, "AWS::CloudWatch::Alarm", "AlarmName", "capacity-staging-api-p99-latency")
	checkAlarm(t, props(p99), wantAlarm{"AWS/ApiGateway", "Latency", "p99", 300, 3, 2, "GreaterThanThreshold", 1500}, topicID)
}

// TestServiceMetricsAreWritten: every metric of the service's namespace that an alarm or the
// dashboard names is one the functions write (emf.MetricNames), so none waits for data that
// never comes.
func TestServiceMetricsAreWritten(t *testing.T) {
	written := map[string]bool{}
	for _, name := range emf.MetricNames {
		written[name] = true
	}
	tp := synth(t, "prod")
	var named []string
	for _, a := range tp.resources("AWS::CloudWatch::Alarm") {
		if p := props(a); p["Namespace"] == MetricsNamespace {
			named = append(named, p["MetricName"].(string))
		}
	}
	for _, d := range tp.resources("AWS::CloudWatch::Dashboard") {
		body := flatten(t, props(d)["DashboardBody"])
		for _, m := range regexp.MustCompile(`"`+MetricsNamespace+`","(\w+)"|MetricName=\\"(\w+)\\"`).FindAllStringSubmatch(body, -1) {
			named = append(named, m[1]+m[2])
		}
	}
	if len(named) < 10 {
		t.Fatalf("found %d metrics of %s, want the alarms' and the dashboard's: %v", len(named), MetricsNamespace, named)
	}
	for _, name := range named {
		if !written[name] {
			t.Errorf("metric %s/%s is named by the stack but no function writes it", MetricsNamespace, name)
		}
	}
}
