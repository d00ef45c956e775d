package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/secrets"
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
			adapter := newAdapter(env.Store, nil, nil, emf.New(&metrics, "local"), time.Minute, agentConfig{}, slog.New(slog.NewJSONHandler(io.Discard, nil)))
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

func TestSchedulerFromEnv(t *testing.T) {
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
			t.Setenv("SCHEDULE_GROUP", tc.group)
			t.Setenv("SCHEDULE_ROLE_ARN", tc.role)
			t.Setenv("EVENT_BUS_ARN", tc.bus)
			s, err := schedulerFromEnv(aws.Config{Region: "us-east-1"})
			if (err != nil) != tc.wantErr || (s != nil) != tc.want {
				t.Fatalf("scheduler %v, err %v", s, err)
			}
		})
	}
}

func TestAllowHTTPAgents(t *testing.T) {
	for _, tc := range []struct {
		in, appEnv string
		want       bool
		wantErr    bool
	}{
		{"", "prod", false, false}, {"false", "prod", false, false}, {"", "local", false, false},
		{"true", "local", true, false},
		{"true", "prod", false, true}, {"true", "dev", false, true}, {"true", "", false, true},
		{"TRUE", "local", false, true}, {"1", "local", false, true}, {"yes", "local", false, true},
	} {
		got, err := allowHTTPAgents(tc.in, tc.appEnv)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("allowHTTPAgents(%q, env %q) = %v, %v; want %v, error %v", tc.in, tc.appEnv, got, err, tc.want, tc.wantErr)
		}
	}
}

// staticMasters is a fixed agent master secret.
type staticMasters []byte

func (m staticMasters) Secrets(context.Context) ([]byte, [][]byte, error) { return m, nil, nil }

// TestWiredOperatorRoutes: the function wires node registration to the agent keys (the 201
// hands out the node's derived key), ALLOW_HTTP_AGENTS to the endpoint check, and key
// management to the keys table.
func TestWiredOperatorRoutes(t *testing.T) {
	master := staticMasters("0123456789abcdef0123456789abcdef")
	call := func(t *testing.T, adapter interface {
		ProxyWithContext(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error)
	}, method, path, body string) events.APIGatewayProxyResponse {
		t.Helper()
		resp, err := adapter.ProxyWithContext(context.Background(), events.APIGatewayProxyRequest{
			HTTPMethod: method, Path: path, Body: body,
			Headers: map[string]string{"Authorization": "Bearer ork_demo_operator", "Content-Type": "application/json"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, tc := range []struct {
		name      string
		agents    agentConfig
		endpoint  string
		status    int
		wantKey   bool
		wantError string
	}{
		{"https agent, key handed out", agentConfig{Keys: agent.Derived{Masters: master}}, "https://agent.example:8443", 201, true, ""},
		{"no key source: no key", agentConfig{}, "https://agent.example:8443", 201, false, ""},
		{"http agent refused outside local", agentConfig{Keys: agent.Derived{Masters: master}}, "http://127.0.0.1:9000", 422, false, "invalid_request"},
		{"http agent allowed in local", agentConfig{Keys: agent.Derived{Masters: master}, AllowHTTP: true}, "http://127.0.0.1:9000", 201, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := dynamotest.New(t)
			if err := env.Store.Put(context.Background(), demo.Seed(time.Now())); err != nil {
				t.Fatal(err)
			}
			adapter := newAdapter(env.Store, nil, nil, emf.New(io.Discard, "local"), time.Minute, tc.agents, slog.New(slog.NewJSONHandler(io.Discard, nil)))
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
			want := ""
			if tc.wantKey {
				k, err := agent.NodeKey(master, "node-b")
				if err != nil {
					t.Fatal(err)
				}
				want = base64.StdEncoding.EncodeToString(k)
			}
			if out.AgentKey != want {
				t.Errorf("agentKey %q, want %q", out.AgentKey, want)
			}
			// Key management reaches the keys table.
			if resp := call(t, adapter, "GET", "/v1/keys", ""); resp.StatusCode != 200 || !strings.Contains(resp.Body, "key-operator") {
				t.Errorf("GET /v1/keys: %d %s", resp.StatusCode, resp.Body)
			}
		})
	}
}

// switchable is a Secrets Manager client that goes through denied (an IAM refusal injected on
// every GetSecretValue) while deny is set, else through allowed: a permission taken away and
// restored.
type switchable struct {
	allowed, denied secrets.API
	deny            atomic.Bool
}

func (s *switchable) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	if s.deny.Load() {
		return s.denied.GetSecretValue(ctx, in, opts...)
	}
	return s.allowed.GetSecretValue(ctx, in, opts...)
}

// TestPutNodeWithTheMasterSecretDenied: when the function's role may not read the agent
// master secret (AccessDeniedException from Secrets Manager), registering a node answers 500
// internal and writes nothing (no node, no audit record claiming it); once the permission is
// back, the same call registers the node and hands out its key.
func TestPutNodeWithTheMasterSecretDenied(t *testing.T) {
	ctx := context.Background()
	env := dynamotest.New(t)
	if err := env.Store.Put(ctx, demo.Seed(time.Now())); err != nil {
		t.Fatal(err)
	}
	const master = "0123456789abcdef0123456789abcdef"
	smOpts := secretsmanager.Options{Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	plain := secretsmanager.New(smOpts)
	created, err := plain.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String("capacity/test/agent-master"), SecretString: aws.String(master)})
	if err != nil {
		t.Fatal(err)
	}
	inj := awsfault.New(1, awsfault.Rule{Operation: "GetSecretValue", Fault: awsfault.AccessDenied, Rate: 1})
	deniedOpts := smOpts
	deniedOpts.APIOptions = []func(*middleware.Stack) error{inj.APIOption}
	api := &switchable{allowed: plain, denied: secretsmanager.New(deniedOpts)}
	api.deny.Store(true)
	now := time.Now()
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	masters := &secrets.Rotating{API: api, SecretID: aws.ToString(created.ARN), Now: func() time.Time { return time.Unix(0, clock.Load()) }}

	var logs bytes.Buffer
	adapter := newAdapter(env.Store, nil, nil, emf.New(io.Discard, "local"), time.Minute,
		agentConfig{Keys: agent.Derived{Masters: masters}}, slog.New(slog.NewJSONHandler(&logs, nil)))
	put := func() events.APIGatewayProxyResponse {
		t.Helper()
		resp, err := adapter.ProxyWithContext(ctx, events.APIGatewayProxyRequest{
			HTTPMethod: "PUT", Path: "/v1/nodes/node-new",
			Body:    `{"ownerOrgId":"org-owner","unitIds":["gpu-0"],"agentEndpoint":"https://agent.example:8443"}`,
			Headers: map[string]string{"Authorization": "Bearer ork_demo_operator", "Content-Type": "application/json"},
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
		t.Errorf("GetSecretValue refused %d times, want 1 (a refusal is not retried)", inj.Count(awsfault.AccessDenied))
	}
	if n, claims := nodeItems(); n != 0 || len(claims) != 0 {
		t.Errorf("denied: %d state items of node-new, audit records claiming it %v; want none", n, claims)
	}
	if !strings.Contains(logs.String(), "AccessDeniedException") {
		t.Errorf("the refusal is not in the logs:\n%s", logs.String())
	}

	// The permission is restored; the secrets cache tries Secrets Manager again after its
	// back-off.
	api.deny.Store(false)
	clock.Store(now.Add(time.Minute).UnixNano())
	resp = put()
	out.Code, out.AgentKey = "", ""
	if err := json.Unmarshal([]byte(resp.Body), &out); err != nil {
		t.Fatal(err)
	}
	key, err := agent.NodeKey([]byte(master), "node-new")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || out.AgentKey != base64.StdEncoding.EncodeToString(key) {
		t.Fatalf("restored: %d %s, want 201 with the node's key", resp.StatusCode, resp.Body)
	}
	if n, claims := nodeItems(); n == 0 || len(claims) != 1 {
		t.Errorf("restored: %d state items of node-new, audit records %v; want the node and one record", n, claims)
	}
}
