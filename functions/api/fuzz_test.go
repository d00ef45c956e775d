package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/routes"
)

// The API's fuzz targets send what a caller controls (the route's body and content type, the
// If-Match and Idempotency-Key headers, path ids, the query with its cursor) through the
// wired function: adapter, handler, domain, store on the emulator, demo data. Whatever comes
// in, the answer is never a 5xx (a 500 is a bug of ours, and alarmed), a refusal is a JSON
// problem, and a refused call changes nothing (the calls chain of the audit trail aside,
// which records refusals). `make fuzz` runs each for FUZZTIME.

// fuzzAPI is the function under fuzzing.
type fuzzAPI struct {
	env     *dynamotest.Env
	adapter *httpadapter.HandlerAdapter
}

// fuzzSealer seals agent keys without KMS (rotateAgentKey and putNode need one).
type fuzzSealer struct{}

func (fuzzSealer) SealAgentKey(_ context.Context, nodeID string, key []byte) ([]byte, error) {
	return fmt.Appendf(nil, "sealed:%s:%x", nodeID, key), nil
}

// fuzzScheduler takes every schedule (EventBridge Scheduler's part is not under test).
type fuzzScheduler struct{}

func (fuzzScheduler) Create(context.Context, capacity.ScheduledReclaim) error { return nil }
func (fuzzScheduler) Delete(context.Context, capacity.ScheduledReclaim) error { return nil }

func newFuzzAPI(f *testing.F, opts ...dynamotest.Option) *fuzzAPI {
	env := dynamotest.New(f, opts...)
	if err := env.Store.Put(context.Background(), demo.Seed(time.Now())); err != nil {
		f.Fatal(err)
	}
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	adapter := newAdapter(env.Store, &capacitytest.Workflow{}, scheduling{Scheduler: fuzzScheduler{}, MaxPendingPerOrg: 100}, emf.New(io.Discard, "local"), time.Minute,
		agentConfig{Sealer: fuzzSealer{}}, nil, quiet)
	return &fuzzAPI{env: env, adapter: adapter}
}

// fuzzSecrets are the callers: the demo keys (operator first), a key that is no key, none.
var fuzzSecrets = []string{demo.OperatorSecret, demo.OwnerSecret, demo.ManagerSecret, demo.AudienceSecret,
	demo.ReadOnlySecret, demo.SchedulerSecret, "ocap_notakey", ""}

// fuzzPath fills a route's path: its ids are the demo's, but the last one, which is id when
// that is set (escaped as a client would).
func fuzzPath(r routes.Route, id string) string {
	demoIDs := map[string]string{"nodeId": demo.NodeID, "id": demo.ReservationID, "reclaimId": "rcl-none",
		"scheduledReclaimId": "sr-none", "keyId": "key-none", "vmId": "vm-none"}
	parts := strings.Split(r.Path, "/")
	last := -1
	for i, p := range parts {
		if strings.HasPrefix(p, "{") {
			last = i
		}
	}
	for i, p := range parts {
		name, ok := strings.CutPrefix(p, "{")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "}")
		v, known := demoIDs[name]
		if !known {
			v = name + "-none"
		}
		if i == last && id != "" {
			v = url.PathEscape(id)
		}
		parts[i] = v
	}
	return strings.Join(parts, "/")
}

// fuzzCall is one request.
type fuzzCall struct {
	route                uint8 // into routes.All
	secret               uint8 // into fuzzSecrets
	id                   string
	contentType          string
	body                 []byte
	ifMatch, idempotency string
	rawQuery             string
	queryFromCursor      bool   // rawQuery is a cursor: sent as ?cursor=<it>
	limit                string // with a cursor: ?limit=<it>, if set
}

// do sends c and checks the answer and, on a refusal, that nothing changed.
func (a *fuzzAPI) do(t *testing.T, c fuzzCall) {
	r := routes.All[int(c.route)%len(routes.All)]
	req := events.APIGatewayProxyRequest{HTTPMethod: r.Method, Path: fuzzPath(r, c.id), Headers: map[string]string{},
		MultiValueQueryStringParameters: map[string][]string{}, Body: string(c.body)}
	if s := fuzzSecrets[int(c.secret)%len(fuzzSecrets)]; s != "" {
		req.Headers["Authorization"] = "Bearer " + s
	}
	for h, v := range map[string]string{"Content-Type": c.contentType, "If-Match": c.ifMatch, "Idempotency-Key": c.idempotency} {
		if v != "" {
			req.Headers[h] = v
		}
	}
	if c.queryFromCursor {
		req.MultiValueQueryStringParameters["cursor"] = []string{c.rawQuery}
		if c.limit != "" {
			req.MultiValueQueryStringParameters["limit"] = []string{c.limit}
		}
		if c.limit != "" {
			req.MultiValueQueryStringParameters["limit"] = []string{c.limit}
		}
	} else if q, err := url.ParseQuery(c.rawQuery); err == nil {
		req.MultiValueQueryStringParameters = q
	}
	before := a.env.Snapshot(t)
	resp, err := a.adapter.ProxyWithContext(context.Background(), req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.Method, req.Path, err)
	}
	what := fmt.Sprintf("%s %s (headers %q, query %v, body %q)", r.Method, req.Path, req.Headers, req.MultiValueQueryStringParameters, c.body)
	if resp.StatusCode >= 500 {
		t.Fatalf("%s: answered %d: %s", what, resp.StatusCode, resp.Body)
	}
	if resp.StatusCode < 400 {
		return
	}
	if !json.Valid([]byte(resp.Body)) {
		t.Fatalf("%s: refusal %d is not JSON: %q", what, resp.StatusCode, resp.Body)
	}
	if d := before.Diff(a.env.Snapshot(t)); d != "" {
		t.Fatalf("%s: refused %d (%s) but the store changed:\n%s", what, resp.StatusCode, resp.Body, d)
	}
}

// sampleBodies are the bodies of the sample API events (events/api-*.json), by path suffix.
func sampleBodies(f *testing.F) [][]byte {
	files, err := filepath.Glob("../../events/api-*.json")
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var ev events.APIGatewayProxyRequest
		if err := json.Unmarshal(raw, &ev); err != nil {
			f.Fatal(err)
		}
		if ev.Body != "" {
			out = append(out, []byte(ev.Body))
		}
	}
	return out
}

// seedBodies are bodies of the routes' test cases: every route's valid body and its usual
// refusals (an unknown member, a null, a wrong type, not JSON).
var seedBodies = []string{
	`{"unitIds":["gpu-0"],"dryRun":true,"reason":"r"}`,
	`{"unitIds":["gpu-0"],"graceSeconds":30}`,
	`{"unitIds":["gpu-0"],"at":"2031-01-01T00:00:00Z"}`,
	`{"vmId":"vm-9","orgId":"org-buyer","tier":"spot","unitIds":["gpu-6"]}`,
	`{"ownerOrgId":"org-owner","agentEndpoint":"https://agent.example:8443","unitIds":["gpu-0","gpu-1"]}`,
	`{"unitIds":["gpu-0","gpu-1"],"reason":"swap"}`,
	`{"id":"res-9","startsAt":"2030-01-01T00:00:00Z","reservedUnitIds":["gpu-7"],"allowedOrgIds":["org-audience"]}`,
	`{"orgId":"org-owner","permissions":["reservation.read"],"description":"d"}`,
	`{"reason":"node wiped"}`,
	`{"units":3,"maxEvictions":1}`,
	`{"unitIds":["gpu-0"],"dryrun":true}`,
	`{"unitIds":null}`,
	`{"unitIds":"gpu-0"}`,
	`{}`,
	`[]`,
	`not json`,
	``,
}

// FuzzAPIBody: every route's body, as any content type, from any caller.
func FuzzAPIBody(f *testing.F) {
	a := newFuzzAPI(f)
	bodies := sampleBodies(f)
	for _, b := range seedBodies {
		bodies = append(bodies, []byte(b))
	}
	// Each route with one body of the cases (cycling through them), every body on the reclaim
	// route: few seeds, as each costs a call and two reads of the tables to fuzz from.
	for i := range routes.All {
		f.Add(uint8(i), uint8(i%3), "application/json", bodies[i%len(bodies)])
	}
	reclaim := slices.IndexFunc(routes.All, func(r routes.Route) bool { return r.OperationID == "reclaim" })
	for _, b := range bodies {
		f.Add(uint8(reclaim), uint8(0), "application/json", b)
	}
	f.Add(uint8(reclaim), uint8(1), "text/plain", []byte(seedBodies[0]))
	f.Fuzz(func(t *testing.T, route, secret uint8, contentType string, body []byte) {
		a.do(t, fuzzCall{route: route, secret: secret, contentType: contentType, body: body})
	})
}

// FuzzAPIHeaders: the If-Match and Idempotency-Key headers (and a path id) on every route.
func FuzzAPIHeaders(f *testing.F) {
	a := newFuzzAPI(f)
	headers := [][3]string{ // If-Match, Idempotency-Key, a path id
		{`"0123456789abcdef"`, "key-1", ""},
		{`W/"x"`, "", ""},
		{"*", strings.Repeat("k", 300), ""},
		{`"unterminated`, "key with spaces", "node-a"},
		{"", "ключ", "../x"},
		{`"a", "b"`, "\x00", "%2F"},
	}
	for i := range routes.All {
		h := headers[i%len(headers)]
		f.Add(uint8(i), uint8(0), h[0], h[1], h[2], []byte(seedBodies[i%3]))
	}
	f.Fuzz(func(t *testing.T, route, secret uint8, ifMatch, idempotency, id string, body []byte) {
		a.do(t, fuzzCall{route: route, secret: secret, contentType: "application/json", body: body,
			ifMatch: ifMatch, idempotency: idempotency, id: id})
	})
}
