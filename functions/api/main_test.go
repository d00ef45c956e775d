package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/kmsseal"
)

// TestSampleEvents runs each sample API Gateway event in events/ through the wired function
// (adapter, API, domain, store on the emulator, demo data), as `make invoke` would send it.
func TestSampleEvents(t *testing.T) {
	want := map[string]int{
		"api-reclaim-dry-run.json":       200,
		"api-reclaim.json":               200,
		"api-release.json":               200,
		"api-get-reservation.json":       200,
		"api-place-spot-vm.json":         201,
		"api-reclaim-typo-rejected.json": 400,
		"api-reclaim-no-permission.json": 404,
	}
	files, err := filepath.Glob("../../events/api-*.json")
	if err != nil || len(files) != len(want) {
		t.Fatalf("sample events = %v (%v); want one per case in this test", files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			env := dynamotest.New(t)
			if err := env.Store.Put(context.Background(), demo.Seed(time.Now())); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var ev events.APIGatewayProxyRequest
			if err := json.Unmarshal(raw, &ev); err != nil {
				t.Fatal(err)
			}
			var metrics bytes.Buffer
			// Limited as deployed: the limiter's write goes to the emulator's limits table.
			adapter := newAdapter(env.Store, nil, scheduling{}, emf.New(&metrics, "local"), time.Minute, agentConfig{}, &capacity.RateLimit{PerSecond: 100, Burst: 100}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
			resp, err := adapter.ProxyWithContext(context.Background(), ev)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != want[filepath.Base(file)] {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, want[filepath.Base(file)], resp.Body)
			}
			if !json.Valid([]byte(resp.Body)) {
				t.Fatalf("body is not JSON: %s", resp.Body)
			}
			if filepath.Base(file) == "api-reclaim.json" {
				// The reclaim's metrics, under API Gateway's request id.
				var line struct {
					Reclaims, ReclaimVictims *float64
					RequestID                string `json:"request_id"`
				}
				if err := json.Unmarshal(metrics.Bytes(), &line); err != nil || line.Reclaims == nil || *line.Reclaims != 1 ||
					line.ReclaimVictims == nil || line.RequestID == "" || line.RequestID != ev.RequestContext.RequestID {
					t.Fatalf("metrics line %s (%v), want Reclaims 1 under request id %q", metrics.String(), err, ev.RequestContext.RequestID)
				}
			}
		})
	}
}

// TestReadSettings: the function reads exactly the variables envvar.API declares (an
// undeclared read or a declared one left unread fails it), and refuses a misspelt one.
func TestReadSettings(t *testing.T) {
	stack := []string{"APP_ENV=local", "LOG_LEVEL=debug", "STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k", "LIMITS_TABLE=l",
		"STATE_MACHINE_ARN=arn:sm", "KEY_CACHE_TTL=1m", "HISTORY_RETENTION=2160h", "RATE_LIMIT_PER_SECOND=2.5",
		"RATE_LIMIT_BURST=7", "SCHEDULE_GROUP=g", "SCHEDULE_ROLE_ARN=arn:role", "EVENT_BUS_ARN=arn:bus",
		"MAX_PENDING_SCHEDULED_PER_ORG=9", "AGENT_KEYS_KMS_KEY_ID=arn:key", "AGENT_ALLOW_HTTP=true",
		"CAPACITY_FAULTS=*:Throttling=0.1", "CAPACITY_FAULTS_SEED=3", "AWS_ENDPOINT_URL=http://localhost:4566", "AWS_REGION=r"}
	for _, tc := range []struct {
		name    string
		environ []string
		wantErr string
	}{
		{name: "every variable", environ: stack},
		{name: "the required only", environ: []string{"APP_ENV=prod", "STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k",
			"LIMITS_TABLE=l", "STATE_MACHINE_ARN=arn:sm", "RATE_LIMIT_PER_SECOND=1", "RATE_LIMIT_BURST=1"}},
		{name: "misspelt", environ: append(slices.Clone(stack), "KEY_CACHE_TL=1s"), wantErr: "KEY_CACHE_TL is not one of api's"},
		{name: "the retired name", environ: append(slices.Clone(stack), "ALLOW_HTTP_AGENTS=true"), wantErr: "ALLOW_HTTP_AGENTS is not one of api's"},
		{name: "a required one unset", environ: stack[1:], wantErr: "APP_ENV must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := envvar.New(envvar.API, tc.environ)
			s, err := readSettings(e), e.Err()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.StateTable != "s" || s.rate.PerSecond == 0 || s.keyTTL == 0 {
				t.Errorf("settings %+v", s)
			}
		})
	}
}

func TestReadSchedules(t *testing.T) {
	fn := envvar.Declare("api", envvar.ScheduleGroup, envvar.ScheduleRoleARN, envvar.EventBusARN)
	for _, tc := range []struct {
		name             string
		group, role, bus string
		want             bool // a scheduler
		wantErr          bool
	}{
		{"none: scheduling unavailable", "", "", "", false, false},
		{"all three", "capacity-test", "arn:aws:iam::1:role/r", "arn:aws:events:us-east-1:1:event-bus/capacity-test", true, false},
		{"no bus", "capacity-test", "arn:aws:iam::1:role/r", "", false, true},
		{"only the group", "capacity-test", "", "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := envvar.New(fn, []string{"SCHEDULE_GROUP=" + tc.group, "SCHEDULE_ROLE_ARN=" + tc.role, "EVENT_BUS_ARN=" + tc.bus})
			s := readSchedules(e)
			if err := e.Err(); (err != nil) != tc.wantErr || (s != schedules{}) != tc.want {
				t.Fatalf("schedules %v, err %v", s, err)
			}
		})
	}
}

// kmsOn returns a KMS client of the emulator at url (with the given API options) and a new
// key's id.
func kmsOn(t *testing.T, url string, apiOptions ...func(*middleware.Stack) error) (*kms.Client, string) {
	t.Helper()
	c := kms.New(kms.Options{Region: "us-east-1", BaseEndpoint: aws.String(url),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""), APIOptions: apiOptions})
	out, err := c.CreateKey(context.Background(), &kms.CreateKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	return c, aws.ToString(out.KeyMetadata.KeyId)
}

// storedAgentKey opens the agent key stored on node's item with opener ("" when it has none).
func storedAgentKey(t *testing.T, env *dynamotest.Env, opener *kmsseal.Sealer, node string) string {
	t.Helper()
	n, err := env.Store.GetNode(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	if n.AgentKeyGen == 0 {
		return ""
	}
	k, err := opener.OpenAgentKey(context.Background(), node, n.AgentKey)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

// TestWiredOperatorRoutes: the function wires node registration to the agent key sealer (the
// 201 hands out a random key, which is stored only sealed), AGENT_ALLOW_HTTP to the endpoint
// check, and key management to the keys table.
func TestWiredOperatorRoutes(t *testing.T) {
	call := func(t *testing.T, adapter interface {
		ProxyWithContext(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error)
	}, method, path, body string) events.APIGatewayProxyResponse {
		t.Helper()
		resp, err := adapter.ProxyWithContext(context.Background(), events.APIGatewayProxyRequest{
			HTTPMethod: method, Path: path, Body: body,
			Headers: map[string]string{"Authorization": "Bearer ocap_demoOperator000000000000000000000000000000020pbNU", "Content-Type": "application/json"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, tc := range []struct {
		name      string
		sealer    bool
		allowHTTP bool
		endpoint  string
		status    int
		wantKey   bool
		wantError string
	}{
		{"https agent, key handed out", true, false, "https://agent.example:8443", 201, true, ""},
		{"no sealer: no key", false, false, "https://agent.example:8443", 201, false, ""},
		{"http agent refused outside local", true, false, "http://127.0.0.1:9000", 422, false, "invalid_request"},
		{"http agent allowed in local", true, true, "http://127.0.0.1:9000", 201, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := dynamotest.New(t)
			if err := env.Store.Put(context.Background(), demo.Seed(time.Now())); err != nil {
				t.Fatal(err)
			}
			kc, keyID := kmsOn(t, env.URL)
			sealer := kmsseal.New(kc, keyID)
			agents := agentConfig{AllowHTTP: tc.allowHTTP}
			if tc.sealer {
				agents.Sealer = sealer
			}
			adapter := newAdapter(env.Store, nil, scheduling{}, emf.New(io.Discard, "local"), time.Minute, agents, nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
			resp := call(t, adapter, "PUT", "/v1/nodes/node-b", `{"ownerOrgId":"org-owner","unitIds":["gpu-0"],"agentEndpoint":"`+tc.endpoint+`"}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, resp.Body)
			}
			var out struct {
				AgentKey string `json:"agentKey"`
				Code     string `json:"code"`
			}
			if err := json.Unmarshal([]byte(resp.Body), &out); err != nil {
				t.Fatal(err)
			}
			if out.Code != tc.wantError {
				t.Errorf("code %q, want %q", out.Code, tc.wantError)
			}
			if k, err := base64.StdEncoding.DecodeString(out.AgentKey); tc.wantKey && (err != nil || len(k) != 32) {
				t.Errorf("agentKey %q, want 32 bytes in base64", out.AgentKey)
			}
			if !tc.wantKey && out.AgentKey != "" {
				t.Errorf("agentKey %q, want none", out.AgentKey)
			}
			if tc.status == 201 {
				// What is stored opens (for the terminating function) to the key handed out.
				if got := storedAgentKey(t, env, sealer, "node-b"); got != out.AgentKey {
					t.Errorf("stored key opens to %q, handed out %q", got, out.AgentKey)
				}
			}
			// Key management reaches the keys table.
			if resp := call(t, adapter, "GET", "/v1/keys", ""); resp.StatusCode != 200 || !strings.Contains(resp.Body, "key-operator") {
				t.Errorf("GET /v1/keys: %d %s", resp.StatusCode, resp.Body)
			}
		})
	}
}

// TestPutNodeWithKMSEncryptDenied: when the function's role may not encrypt under the agent
// keys' KMS key (AccessDeniedException), registering a node answers 500 internal and writes
// nothing (no node, no audit record claiming it); once the permission is back, the same call
// registers the node and hands out its key.
func TestPutNodeWithKMSEncryptDenied(t *testing.T) {
	ctx := context.Background()
	env := dynamotest.New(t)
	if err := env.Store.Put(ctx, demo.Seed(time.Now())); err != nil {
		t.Fatal(err)
	}
	inj := awsfault.New(1, awsfault.Rule{Operation: "Encrypt", Fault: awsfault.AccessDenied, Rate: 1})
	plain, keyID := kmsOn(t, env.URL)
	denied, _ := kmsOn(t, env.URL, inj.APIOption)
	api := &switchable{allowed: plain, denied: denied}
	api.deny.Store(true)

	var logs bytes.Buffer
	adapter := newAdapter(env.Store, nil, scheduling{}, emf.New(io.Discard, "local"), time.Minute,
		agentConfig{Sealer: kmsseal.New(api, keyID)}, nil, slog.New(slog.NewJSONHandler(&logs, nil)))
	put := func() events.APIGatewayProxyResponse {
		t.Helper()
		resp, err := adapter.ProxyWithContext(ctx, events.APIGatewayProxyRequest{
			HTTPMethod: "PUT", Path: "/v1/nodes/node-new",
			Body:    `{"ownerOrgId":"org-owner","unitIds":["gpu-0"],"agentEndpoint":"https://agent.example:8443"}`,
			Headers: map[string]string{"Authorization": "Bearer ocap_demoOperator000000000000000000000000000000020pbNU", "Content-Type": "application/json"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// nodeItems counts the items of node-new's partitions in the state table; claims the audit
	// records of it that are not failures.
	nodeItems := func() (items int, claims []string) {
		for _, it := range env.Items(t, env.Store.Table) {
			if pk, _ := it["pk"].(*types.AttributeValueMemberS); pk != nil && strings.HasPrefix(pk.Value, "NODE#node-new") {
				items++
			}
		}
		for _, it := range env.Items(t, env.Store.AuditTable) {
			node, _ := it["NodeID"].(*types.AttributeValueMemberS)
			outcome, _ := it["Outcome"].(*types.AttributeValueMemberS)
			if node != nil && node.Value == "node-new" && (outcome == nil || outcome.Value == "ok") {
				claims = append(claims, fmt.Sprint(it["ID"]))
			}
		}
		return items, claims
	}

	resp := put()
	var out struct {
		Code     string `json:"code"`
		AgentKey string `json:"agentKey"`
	}
	if err := json.Unmarshal([]byte(resp.Body), &out); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 500 || out.Code != "internal" || out.AgentKey != "" {
		t.Fatalf("denied: %d %s, want 500 internal and no agentKey", resp.StatusCode, resp.Body)
	}
	if inj.Count(awsfault.AccessDenied) != 1 {
		t.Errorf("Encrypt refused %d times, want 1 (a refusal is not retried)", inj.Count(awsfault.AccessDenied))
	}
	if n, claims := nodeItems(); n != 0 || len(claims) != 0 {
		t.Errorf("denied: %d state items of node-new, audit records claiming it %v; want none", n, claims)
	}
	if !strings.Contains(logs.String(), "AccessDeniedException") {
		t.Errorf("the refusal is not in the logs:\n%s", logs.String())
	}

	// The permission is restored.
	api.deny.Store(false)
	resp = put()
	out.Code, out.AgentKey = "", ""
	if err := json.Unmarshal([]byte(resp.Body), &out); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || out.AgentKey == "" || storedAgentKey(t, env, kmsseal.New(plain, keyID), "node-new") != out.AgentKey {
		t.Fatalf("restored: %d %s, want 201 with the node's stored key", resp.StatusCode, resp.Body)
	}
	if n, claims := nodeItems(); n == 0 || len(claims) != 1 {
		t.Errorf("restored: %d state items of node-new, audit records %v; want the node and one record", n, claims)
	}
}

// switchable is a KMS client that goes through denied (an IAM refusal injected) while deny
// is set, else through allowed: a permission taken away and restored.
type switchable struct {
	allowed, denied kmsseal.API
	deny            atomic.Bool
}

func (s *switchable) Encrypt(ctx context.Context, in *kms.EncryptInput, opts ...func(*kms.Options)) (*kms.EncryptOutput, error) {
	if s.deny.Load() {
		return s.denied.Encrypt(ctx, in, opts...)
	}
	return s.allowed.Encrypt(ctx, in, opts...)
}

func (s *switchable) Decrypt(ctx context.Context, in *kms.DecryptInput, opts ...func(*kms.Options)) (*kms.DecryptOutput, error) {
	return s.allowed.Decrypt(ctx, in, opts...)
}

// TestOpenAPIServersURLIsWhereTheAPIIs: the served document's server, resolved against the
// URL the client fetched it from, is the API's base, so that a client taking its base URL from
// the document reaches the API: the stage on the execute-api domain, a base path mapping on a
// custom domain, the host's root, and the local stack's path form (which the function sees as
// the stage alone).
func TestOpenAPIServersURLIsWhereTheAPIIs(t *testing.T) {
	adapter := newAdapter(dynamotest.New(t).Store, nil, scheduling{}, emf.New(io.Discard, "local"), time.Minute, agentConfig{}, nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	for _, tc := range []struct {
		name, stage, contextPath, base string
	}{
		{"execute-api domain", "prod", "/prod/v1/openapi.json", "https://x.execute-api.eu-west-1.amazonaws.com/prod"},
		{"custom domain, base path mapping", "prod", "/capacity/v1/openapi.json", "https://api.example.com/capacity"},
		{"custom domain at the root", "prod", "/v1/openapi.json", "https://api.example.com"},
		{"context path without the route: the stage", "dev", "", "https://x.execute-api.eu-west-1.amazonaws.com/dev"},
		{"the local stack's path form", "local", "/local/v1/openapi.json", "http://127.0.0.1:4566/restapis/x/local/_user_request_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := adapter.ProxyWithContext(context.Background(), events.APIGatewayProxyRequest{
				HTTPMethod: "GET", Path: "/v1/openapi.json", Resource: "/v1/openapi.json",
				RequestContext: events.APIGatewayProxyRequestContext{Stage: tc.stage, Path: tc.contextPath, RequestID: "req-1"},
			})
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET /v1/openapi.json: %d %v", resp.StatusCode, err)
			}
			var doc struct {
				Servers []struct{ URL string } `json:"servers"`
			}
			if err := json.Unmarshal([]byte(resp.Body), &doc); err != nil || len(doc.Servers) != 1 {
				t.Fatalf("servers %+v (%v), want one", doc.Servers, err)
			}
			fetched, err := url.Parse(tc.base + "/v1/openapi.json")
			if err != nil {
				t.Fatal(err)
			}
			ref, err := url.Parse(doc.Servers[0].URL)
			if err != nil {
				t.Fatal(err)
			}
			if got := fetched.ResolveReference(ref).String(); strings.TrimSuffix(got, "/") != tc.base {
				t.Errorf("server %q fetched from %s resolves to %s, want %s", ref, fetched, got, tc.base)
			}
		})
	}
}

// TestReadWithoutDatabaseAnswersUnavailable: a read whose every attempt gets no answer from
// DynamoDB (the connection refused, or no answer in time), after the SDK's retries, answers
// 503 unavailable with Retry-After, not 500: the caller may retry, and nothing was changed.
func TestReadWithoutDatabaseAnswersUnavailable(t *testing.T) {
	ctx := context.Background()
	for _, fault := range []awsfault.Fault{awsfault.ConnectionRefused, awsfault.AmbiguousTimeout} {
		for _, tc := range []struct{ name, secret, path, op string }{
			{"get reservation", demo.OwnerSecret, "/v1/nodes/" + demo.NodeID + "/reservations/" + demo.ReservationID, "Query"},
			{"list reclaims", demo.OwnerSecret, "/v1/nodes/" + demo.NodeID + "/reservations/" + demo.ReservationID + "/reclaims", "Query"},
			{"list nodes", demo.OperatorSecret, "/v1/nodes", "Query"},
			{"list keys", demo.OperatorSecret, "/v1/keys", "Scan"},
		} {
			t.Run(string(fault)+"/"+tc.name, func(t *testing.T) {
				// Every attempt of the route's own read fails; the key's lookup (GetItem) goes through.
				inj := awsfault.New(1, awsfault.Rule{Operation: tc.op, Fault: fault, Rate: 1})
				env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
				if err := env.Clean().Put(ctx, demo.Seed(time.Now())); err != nil { // the seed reads too: past the faults
					t.Fatal(err)
				}
				adapter := newAdapter(env.Store, nil, scheduling{}, emf.New(io.Discard, "local"), time.Minute, agentConfig{}, nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
				resp, err := adapter.ProxyWithContext(ctx, events.APIGatewayProxyRequest{HTTPMethod: "GET", Path: tc.path,
					Headers: map[string]string{"Authorization": "Bearer " + tc.secret}})
				if err != nil {
					t.Fatal(err)
				}
				var p struct{ Code string }
				_ = json.Unmarshal([]byte(resp.Body), &p)
				retryAfter := resp.MultiValueHeaders["Retry-After"]
				if resp.StatusCode != 503 || p.Code != "unavailable" || !slices.Equal(retryAfter, []string{"1"}) {
					t.Errorf("GET %s: %d %q, Retry-After %q; want 503 unavailable, Retry-After 1: %s", tc.path, resp.StatusCode, p.Code, retryAfter, resp.Body)
				}
				if inj.Count(fault) < 2 {
					t.Errorf("%d faults injected: the SDK did not retry the read", inj.Count(fault))
				}
			})
		}
	}
}
