package capacity_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// op is an operator holding every permission (the operator routes each need their own).
var op = capacity.Bootstrap("platform")

// stateItems is the state table without the head of the nodes' calls chains, which every
// audited call that changed nothing (a refusal) advances. The node item is kept whole: a
// refusal must not move its version or its changes chain's head.
func stateItems(t *testing.T, env *dynamotest.Env) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	for _, it := range env.Items(t, env.Store.Table) {
		if sk, ok := it["sk"].(*types.AttributeValueMemberS); !ok || sk.Value != "AUDITHEAD#CALLS" {
			items = append(items, it)
		}
	}
	return items
}

// testSealer "seals" a key as "sealed:<node>:<hex key>", so tests can read what was stored.
type testSealer struct{ calls int }

func (s *testSealer) SealAgentKey(_ context.Context, nodeID string, key []byte) ([]byte, error) {
	s.calls++
	return []byte(fmt.Sprintf("sealed:%s:%x", nodeID, key)), nil
}

func sealedFor(node string, key []byte) []byte { return []byte(fmt.Sprintf("sealed:%s:%x", node, key)) }

// auditActions returns the action and outcome of every audit record, in no order.
func opAudits(t *testing.T, env *dynamotest.Env) []string {
	t.Helper()
	var out []string
	for _, it := range env.Items(t, env.Store.AuditTable) {
		out = append(out, attrString(it["Action"])+":"+attrString(it["Outcome"]))
	}
	slices.Sort(out)
	return out
}

func checkInvariants(t *testing.T, env *dynamotest.Env, nodeID string, now time.Time) {
	t.Helper()
	st, err := env.Store.LoadNode(context.Background(), nodeID, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(capacity.Violations(st, now), capacity.OverlapViolations(st, now)...) {
		t.Error(v)
	}
}

func code(err error) capacity.Code {
	if err == nil {
		return ""
	}
	return capacity.ErrorCode(err)
}

func TestOperatorCallsAreOperatorsOnly(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	nonOps := []capacity.Principal{owner, audi, {OrgID: "owner", Permissions: []string{capacity.PermRead, capacity.PermCapacity, capacity.PermPlace}}}
	for _, p := range nonOps {
		calls := map[string]error{}
		_, calls["put"] = svc.PutNode(ctx, p, capacity.NodeRequest{NodeID: "n9", OwnerOrgID: "o", UnitIDs: []string{"u0"}, AgentEndpoint: "https://a"}, capacity.RequestMeta{})
		_, calls["create"] = svc.CreateReservation(ctx, p, capacity.ReservationRequest{NodeID: "n1", StartsAt: t0, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
		_, calls["cancel"] = svc.CancelReservation(ctx, p, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
		_, calls["reaffirm"] = svc.ReaffirmReservation(ctx, p, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
		_, calls["topology"] = svc.SetTopology(ctx, p, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{})
		for name, err := range calls {
			if code(err) != capacity.CodeNotFound {
				t.Errorf("%s by %s: %v, want not_found", name, p.OrgID, err)
			}
		}
	}
	if a := opAudits(t, env); len(a) != 0 {
		t.Errorf("refused non-operators were audited: %v", a)
	}
}

func TestPutNode(t *testing.T) {
	env, svc := world(t)
	sealer := &testSealer{}
	svc.AgentKeySealer = sealer
	ctx := context.Background()
	req := capacity.NodeRequest{NodeID: "n2", OwnerOrgID: "acme", UnitIDs: []string{"g1", "g0"}, AgentEndpoint: "https://n2.example:8443/agent", IdempotencyKey: "put-1"}

	res, err := svc.PutNode(ctx, op, req, capacity.RequestMeta{RequestID: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || len(res.AgentKey) != capacity.AgentKeyBytes || res.SecretShown || res.Node.Version != 1 || res.Node.TopologyGen != 1 || res.Node.AuditHead.Seq != 1 {
		t.Fatalf("create = %+v", res)
	}
	key1 := res.AgentKey
	n, err := env.Store.GetNode(ctx, "n2")
	if err != nil || n.OwnerOrgID != "acme" || n.AgentEndpoint != req.AgentEndpoint || !slices.Equal(n.UnitIDs, []string{"g1", "g0"}) || n.AuditHead != res.Node.AuditHead {
		t.Fatalf("stored node = %+v, %v", n, err)
	}
	// Stored sealed only, at generation 1, with nothing to fall back on.
	if n.AgentKeyGen != 1 || !bytes.Equal(n.AgentKey, sealedFor("n2", key1)) || n.PrevAgentKey != nil || !n.AgentKeyRotatedAt.IsZero() {
		t.Fatalf("stored agent key = gen %d %q prev %q at %v", n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt)
	}

	// A replay answers the same without the secret, which was never stored.
	again, err := svc.PutNode(ctx, op, req, capacity.RequestMeta{})
	if err != nil || !again.Replayed || !again.Created || again.AgentKey != nil || !again.SecretShown {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	for _, it := range env.Items(t, env.Store.Table) {
		if b, ok := it["Result"].(*types.AttributeValueMemberB); ok && (bytes.Contains(b.Value, []byte(base64.StdEncoding.EncodeToString(key1))) || bytes.Contains(b.Value, []byte("sealed:"))) {
			t.Fatalf("the agent key was stored in the idempotency record: %s", b.Value)
		}
	}

	// An update of the endpoint alone: the key stays.
	upd := capacity.NodeRequest{NodeID: "n2", OwnerOrgID: "acme", UnitIDs: []string{"g0", "g1"}, AgentEndpoint: "https://n2b.example"}
	res, err = svc.PutNode(ctx, op, upd, capacity.RequestMeta{})
	if err != nil || res.Created || res.AgentKey != nil || res.Node.Version != 2 || res.Node.AgentKeyGen != 1 {
		t.Fatalf("endpoint update = %+v, %v", res, err)
	}
	// A new owner: a new key, handed out once; the former owner's is the previous one,
	// which works only for the overlap.
	upd.OwnerOrgID = "acme2"
	res, err = svc.PutNode(ctx, op, upd, capacity.RequestMeta{})
	if err != nil || res.Created || len(res.AgentKey) != capacity.AgentKeyBytes || bytes.Equal(res.AgentKey, key1) || res.Node.OwnerOrgID != "acme2" || res.Node.Version != 3 || res.Node.AgentKeyGen != 2 {
		t.Fatalf("owner change = %+v, %v", res, err)
	}
	n, err = env.Store.GetNode(ctx, "n2")
	if err != nil || n.AgentKeyGen != 2 || !bytes.Equal(n.AgentKey, sealedFor("n2", res.AgentKey)) || !bytes.Equal(n.PrevAgentKey, sealedFor("n2", key1)) || !n.AgentKeyRotatedAt.Equal(svc.Now()) {
		t.Fatalf("after the owner change: %+v, %v", n, err)
	}
	upd.UnitIDs = []string{"g0"}
	if _, err := svc.PutNode(ctx, op, upd, capacity.RequestMeta{}); code(err) != capacity.CodeInvalidTransition {
		t.Fatalf("unit change through PUT node: %v, want invalid_transition", err)
	}
	if sealer.calls != 2 {
		t.Errorf("%d keys sealed, want 2 (registration, owner change)", sealer.calls)
	}
	// The owner org reads its node with reservation.read; others do not learn it exists.
	if _, err := svc.GetNode(ctx, capacity.Principal{OrgID: "acme2", Permissions: []string{capacity.PermRead}}, "n2"); err != nil {
		t.Errorf("owner GetNode: %v", err)
	}
	if _, err := svc.GetNode(ctx, capacity.Principal{OrgID: "acme", Permissions: []string{capacity.PermRead}}, "n2"); code(err) != capacity.CodeNotFound {
		t.Errorf("other org GetNode: %v, want not_found", err)
	}
	want := []string{"node.put:invalid_transition", "node.put:ok", "node.put:ok", "node.put:ok", "node.put:replayed"}
	if got := opAudits(t, env); !reflect.DeepEqual(got, want) {
		t.Errorf("audit = %v, want %v", got, want)
	}
	checkInvariants(t, env, "n2", t0.Add(time.Hour))
}

// TestRotateAgentKey: an operator rotates one node's key: the next generation, a new key
// answered once (a replay says it was shown), the previous key kept for the overlap; the
// node's other state is unchanged, and nobody else can rotate (404, nothing written).
func TestRotateAgentKey(t *testing.T) {
	env, svc := world(t)
	svc.AgentKeySealer = &testSealer{}
	ctx := context.Background()
	reg, err := svc.PutNode(ctx, op, capacity.NodeRequest{NodeID: "n2", OwnerOrgID: "acme", UnitIDs: []string{"g0"}, AgentEndpoint: "https://n2"}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	before := stateItems(t, env)
	for _, p := range []capacity.Principal{
		{OrgID: "acme", Permissions: []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}}, // the owner
		{OrgID: "x", Permissions: []string{capacity.PermCapacity}},
	} {
		if _, err := svc.RotateAgentKey(ctx, p, capacity.AgentKeyRotation{NodeID: "n2"}, capacity.RequestMeta{}); code(err) != capacity.CodeNotFound {
			t.Errorf("rotation by %s: %v, want not_found", p.OrgID, err)
		}
	}
	if !reflect.DeepEqual(stateItems(t, env), before) {
		t.Fatal("a refused rotation wrote")
	}

	tests := []struct {
		name     string
		req      capacity.AgentKeyRotation
		wantCode capacity.Code
		wantGen  int64
	}{
		{"rotate", capacity.AgentKeyRotation{NodeID: "n2", Reason: "laptop lost", IdempotencyKey: "rot-1"}, "", 2},
		{"again: another generation", capacity.AgentKeyRotation{NodeID: "n2", IdempotencyKey: "rot-2"}, "", 3},
		{"missing node", capacity.AgentKeyRotation{NodeID: "n404"}, capacity.CodeNotFound, 0},
		{"malformed node id", capacity.AgentKeyRotation{NodeID: "a/b"}, capacity.CodeNotFound, 0},
		{"reason too long", capacity.AgentKeyRotation{NodeID: "n2", Reason: strings.Repeat("x", capacity.MaxReasonLen+1)}, capacity.CodeInvalidRequest, 0},
	}
	prevKey := reg.AgentKey
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := svc.RotateAgentKey(ctx, op, tc.req, capacity.RequestMeta{})
			if code(err) != tc.wantCode {
				t.Fatalf("err %v, want %q", err, tc.wantCode)
			}
			if tc.wantCode != "" {
				return
			}
			if res.Gen != tc.wantGen || len(res.AgentKey) != capacity.AgentKeyBytes || bytes.Equal(res.AgentKey, prevKey) ||
				!res.PreviousValidUntil.Equal(svc.Now().Add(capacity.AgentKeyOverlap)) {
				t.Fatalf("rotation = %+v", res)
			}
			n, err := env.Store.GetNode(ctx, "n2")
			if err != nil || n.AgentKeyGen != tc.wantGen || !bytes.Equal(n.AgentKey, sealedFor("n2", res.AgentKey)) ||
				!bytes.Equal(n.PrevAgentKey, sealedFor("n2", prevKey)) || n.OwnerOrgID != "acme" || !slices.Equal(n.UnitIDs, []string{"g0"}) {
				t.Fatalf("stored = %+v, %v", n, err)
			}
			prevKey = res.AgentKey
			// A replay: the same generation, no key.
			again, err := svc.RotateAgentKey(ctx, op, tc.req, capacity.RequestMeta{})
			if err != nil || !again.Replayed || again.Gen != tc.wantGen || again.AgentKey != nil || !again.SecretShown {
				t.Fatalf("replay = %+v, %v", again, err)
			}
		})
	}
	want := []string{"node.agent-key.rotate:invalid_request", "node.agent-key.rotate:ok", "node.agent-key.rotate:ok",
		"node.agent-key.rotate:replayed", "node.agent-key.rotate:replayed", "node.put:ok"}
	got := opAudits(t, env)
	slices.Sort(got)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("audit = %v, want %v", got, want)
	}
}

func TestPutNodeValidation(t *testing.T) {
	env, svc := world(t)
	ok := capacity.NodeRequest{NodeID: "n2", OwnerOrgID: "acme", UnitIDs: []string{"g0"}, AgentEndpoint: "https://n2"}
	tests := []struct {
		name      string
		change    func(*capacity.NodeRequest)
		allowHTTP bool
		want      capacity.Code
	}{
		{"malformed node id", func(r *capacity.NodeRequest) { r.NodeID = "../x" }, false, capacity.CodeInvalidRequest},
		{"no owner", func(r *capacity.NodeRequest) { r.OwnerOrgID = "" }, false, capacity.CodeInvalidRequest},
		{"no units", func(r *capacity.NodeRequest) { r.UnitIDs = nil }, false, capacity.CodeInvalidRequest},
		{"duplicate units", func(r *capacity.NodeRequest) { r.UnitIDs = []string{"g0", "g0"} }, false, capacity.CodeInvalidRequest},
		{"http outside local", func(r *capacity.NodeRequest) { r.AgentEndpoint = "http://n2" }, false, capacity.CodeInvalidRequest},
		{"http in local", func(r *capacity.NodeRequest) { r.AgentEndpoint = "http://n2" }, true, ""},
		{"relative endpoint", func(r *capacity.NodeRequest) { r.AgentEndpoint = "/agent" }, true, capacity.CodeInvalidRequest},
		{"other scheme", func(r *capacity.NodeRequest) { r.AgentEndpoint = "ftp://n2" }, true, capacity.CodeInvalidRequest},
		{"no endpoint", func(r *capacity.NodeRequest) { r.AgentEndpoint = "" }, false, capacity.CodeInvalidRequest},
		// The agent client refuses these for good: a node registered with one could never
		// have a VM terminated.
		{"query string", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://n2/agent?token=x" }, false, capacity.CodeInvalidRequest},
		{"empty query", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://n2/agent?" }, false, capacity.CodeInvalidRequest},
		{"fragment", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://n2/agent#x" }, false, capacity.CodeInvalidRequest},
		{"empty fragment", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://n2/agent#" }, false, capacity.CodeInvalidRequest},
		{"user info", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://u:p@n2/agent" }, false, capacity.CodeInvalidRequest},
		{"path and port", func(r *capacity.NodeRequest) { r.AgentEndpoint = "https://n2.example:8443/agent/v2" }, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := ok
			req.NodeID = "n-" + string(rune('a'+len(tt.name)%26))
			tt.change(&req)
			before := len(env.Items(t, env.Store.Table))
			svc.AllowHTTPAgents = tt.allowHTTP
			_, err := svc.PutNode(context.Background(), op, req, capacity.RequestMeta{})
			if code(err) != tt.want {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			if tt.want != "" && len(env.Items(t, env.Store.Table)) != before {
				t.Error("a refused request wrote")
			}
		})
	}
}

func TestCreateReservation(t *testing.T) {
	end := t0.Add(48 * time.Hour)
	base := capacity.ReservationRequest{NodeID: "n1", ID: "r2", StartsAt: t0, EndsAt: &end, AllowedOrgIDs: []string{"aud"}, ReservedUnitIDs: []string{"u3"}, ContractRef: "c-1"}
	tests := []struct {
		name      string
		cancelR1  bool
		change    func(*capacity.ReservationRequest)
		want      capacity.Code
		wantUnits []string // the error's units, or the created reservation's released units
	}{
		{"free unit", false, func(*capacity.ReservationRequest) {}, "", []string{}},
		{"unknown unit", false, func(r *capacity.ReservationRequest) { r.ReservedUnitIDs = []string{"u3", "u9"} }, capacity.CodeUnknownUnits, []string{"u9"}},
		{"held by r1", false, func(r *capacity.ReservationRequest) { r.ReservedUnitIDs = []string{"u2", "u3"} }, capacity.CodeReservationOverlap, []string{"u2"}},
		{"existing id", false, func(r *capacity.ReservationRequest) { r.ID = "r1" }, capacity.CodeReservationExists, nil},
		{"ends before it starts", false, func(r *capacity.ReservationRequest) { r.EndsAt = &t0 }, capacity.CodeInvalidRequest, nil},
		{"bad status", false, func(r *capacity.ReservationRequest) { r.Status = capacity.StatusExpired }, capacity.CodeInvalidRequest, nil},
		{"duplicate orgs", false, func(r *capacity.ReservationRequest) { r.AllowedOrgIDs = []string{"a", "a"} }, capacity.CodeInvalidRequest, nil},
		{"reserved VM on unit", true, func(r *capacity.ReservationRequest) { r.ReservedUnitIDs = []string{"u0"} }, capacity.CodeUnitsInUse, []string{"u0"}},
		{"spot VM unit starts released", true, func(r *capacity.ReservationRequest) { r.ReservedUnitIDs = []string{"u1", "u2"} }, "", []string{"u1"}},
		{"pending, generated id", false, func(r *capacity.ReservationRequest) { r.ID, r.Status = "", capacity.StatusPending }, "", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			if tt.cancelR1 {
				if _, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{}); err != nil {
					t.Fatal(err)
				}
			}
			req := base
			tt.change(&req)
			before := stateItems(t, env)
			res, err := svc.CreateReservation(ctx, op, req, capacity.RequestMeta{})
			if code(err) != tt.want {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			if err != nil {
				if e, ok := err.(*capacity.Error); ok && tt.wantUnits != nil && !slices.Equal(e.UnitIDs, tt.wantUnits) {
					t.Errorf("error units %v, want %v", e.UnitIDs, tt.wantUnits)
				}
				if !reflect.DeepEqual(stateItems(t, env), before) {
					t.Error("a refused create wrote")
				}
				return
			}
			r := res.Reservation
			if !slices.Equal(r.ReleasedUnitIDs, tt.wantUnits) || r.TopologyGen != 1 || r.Version != 1 {
				t.Errorf("created %+v", r)
			}
			if req.ID == "" && (len(r.ID) < 5 || r.ID[:4] != "res-") {
				t.Errorf("generated id %q", r.ID)
			}
			got, err := svc.GetReservation(ctx, op, "n1", r.ID)
			if err != nil || !slices.Equal(got.ReservedUnitIDs, req.ReservedUnitIDs) || got.ContractRef != "c-1" {
				t.Errorf("stored = %+v, %v", got, err)
			}
			checkInvariants(t, env, "n1", t0.Add(time.Hour))
		})
	}
}

func TestCancelReservation(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	ch := capacity.ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: "contract ended"}
	res, err := svc.CancelReservation(ctx, op, ch, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reservation.Status != capacity.StatusCancelled || res.Reservation.Reason != "contract ended" {
		t.Fatalf("cancel = %+v", res.Reservation)
	}
	if ids := capacity.VMIDs(res.VMsOnUnits); !slices.Equal(ids, []string{"s1", "v0"}) {
		t.Errorf("vmsOnUnits = %v, want [s1 v0] (left running)", ids)
	}
	st, _ := env.Store.LoadNode(ctx, "n1", "")
	for _, vm := range st.VMs {
		if vm.State != capacity.VMRunning {
			t.Errorf("VM %s is %s: a cancel terminates nothing", vm.ID, vm.State)
		}
	}
	// Repeat-safe.
	again, err := svc.CancelReservation(ctx, op, ch, capacity.RequestMeta{})
	if err != nil || again.Reservation.Status != capacity.StatusCancelled {
		t.Fatalf("second cancel = %+v, %v", again, err)
	}
	// Reaffirm applies to needs-review only.
	if _, err := svc.ReaffirmReservation(ctx, op, ch, capacity.RequestMeta{}); code(err) != capacity.CodeInvalidTransition {
		t.Errorf("reaffirm of cancelled: %v, want invalid_transition", err)
	}
	// An expired reservation cannot be cancelled.
	end := t0.Add(2 * time.Hour)
	if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "r3", StartsAt: t0, EndsAt: &end, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	svc.Now = func() time.Time { return t0.Add(3 * time.Hour) }
	if _, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r3"}, capacity.RequestMeta{}); code(err) != capacity.CodeInvalidTransition {
		t.Errorf("cancel of expired: %v, want invalid_transition", err)
	}
	if _, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "nope"}, capacity.RequestMeta{}); code(err) != capacity.CodeNotFound {
		t.Errorf("cancel of missing: %v, want not_found", err)
	}
	checkInvariants(t, env, "n1", t0.Add(3*time.Hour))
}

func TestTopologyAndReaffirm(t *testing.T) {
	tests := []struct {
		name         string
		units        []string
		wantAdded    []string
		wantRemoved  []string
		wantVMs      []string
		reaffirmCode capacity.Code
	}{
		{"add a unit", []string{"u0", "u1", "u2", "u3", "u4"}, []string{"u4"}, []string{}, []string{}, ""},
		{"remove reserved units", []string{"u0", "u1", "u4"}, []string{"u4"}, []string{"u2", "u3"}, []string{}, capacity.CodeUnknownUnits},
		{"remove a unit under a VM", []string{"u0", "u2", "u3"}, []string{}, []string{"u1"}, []string{"s1"}, capacity.CodeUnknownUnits},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			now := t0.Add(time.Hour)
			// A pending reservation keeps its status and generation through the change, so
			// reaffirm cannot activate it.
			later := t0.Add(24 * time.Hour)
			if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rp", Status: capacity.StatusPending,
				StartsAt: later, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
			res, err := svc.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: tt.units, Reason: "rack swap"}, capacity.RequestMeta{Via: capacity.ViaEvent, EventID: "ev-1"})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Changed || res.Node.TopologyGen != 2 || res.Node.Version != 3 || // created rp: 2
				!slices.Equal(res.AddedUnitIDs, tt.wantAdded) || !slices.Equal(res.RemovedUnitIDs, tt.wantRemoved) ||
				!slices.Equal(res.NeedsReview, []string{"r1"}) || !slices.Equal(capacity.VMIDs(res.VMsOnRemovedUnits), tt.wantVMs) {
				t.Fatalf("topology = %+v", res)
			}
			r, err := svc.GetReservation(ctx, op, "n1", "r1")
			if err != nil || r.Status != capacity.StatusNeedsReview || r.Reason != "topology changed: gen 2" {
				t.Fatalf("r1 after topology = %+v, %v", r, err)
			}
			if rp, err := svc.GetReservation(ctx, op, "n1", "rp"); err != nil || rp.Status != capacity.StatusPending || rp.TopologyGen != 1 {
				t.Errorf("pending rp after topology = %+v, %v; want pending at gen 1", rp, err)
			}
			if _, err := svc.ReaffirmReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "rp"}, capacity.RequestMeta{}); code(err) != capacity.CodeInvalidTransition {
				t.Errorf("reaffirm of pending rp: %v, want invalid_transition", err)
			}
			checkInvariants(t, env, "n1", now)
			// The same list again (in another order) changes nothing but the audit trail (its
			// record goes on the changes chain, in a commit that checks the node's version).
			before := env.StateItems(t)
			same, err := svc.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: slices.Sorted(slices.Values(tt.units))}, capacity.RequestMeta{})
			if err != nil || same.Changed || same.Node.TopologyGen != 2 || len(same.NeedsReview) != 0 {
				t.Fatalf("same topology = %+v, %v", same, err)
			}
			if !reflect.DeepEqual(env.StateItems(t), before) {
				t.Error("an unchanged topology wrote")
			}
			// Reaffirm: back to active at gen 2, unless reserved units went away.
			ra, err := svc.ReaffirmReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
			if code(err) != tt.reaffirmCode {
				t.Fatalf("reaffirm: %v, want %q", err, tt.reaffirmCode)
			}
			if err == nil && (ra.Reservation.Status != capacity.StatusActive || ra.Reservation.TopologyGen != 2) {
				t.Errorf("reaffirmed = %+v", ra.Reservation)
			}
			if err == nil {
				// A reclaim works again at the new generation.
				if _, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{}); err != nil {
					t.Errorf("reclaim after reaffirm: %v", err)
				}
			}
			checkInvariants(t, env, "n1", now)
		})
	}
}

// A topology change made against a generation applies only at that generation: a stale one
// (delivered late) is refused, audited, and writes nothing else.
func TestTopologyExpectedGeneration(t *testing.T) {
	gen := func(g int64) *int64 { return &g }
	tests := []struct {
		name     string
		expected *int64
		want     capacity.Code
		wantText []string
	}{
		{"not given", nil, "", nil},
		{"current", gen(1), "", nil},
		{"stale", gen(3), capacity.CodeTopologyChanged, []string{"generation 1", "generation 3"}},
		{"zero", gen(0), capacity.CodeInvalidRequest, []string{"expectedTopologyGen"}},
		{"negative", gen(-2), capacity.CodeInvalidRequest, []string{"expectedTopologyGen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			before := stateItems(t, env)
			req := capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}, ExpectedTopologyGen: tt.expected}
			res, err := svc.SetTopology(ctx, op, req, capacity.RequestMeta{})
			if code(err) != tt.want {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if tt.want == "" {
				if !res.Changed || res.Node.TopologyGen != 2 {
					t.Errorf("topology = %+v", res)
				}
				return
			}
			if !reflect.DeepEqual(stateItems(t, env), before) {
				t.Error("a refused change wrote")
			}
			if a := opAudits(t, env); !slices.Equal(a, []string{"topology.set:" + string(tt.want)}) {
				t.Errorf("audit %v, want the one refusal", a)
			}
		})
	}
	// The expected generation is part of the request: the same Idempotency-Key with another
	// one is another request.
	_, svc := world(t)
	ctx := context.Background()
	req := capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}, IdempotencyKey: "t1", ExpectedTopologyGen: gen(1)}
	if _, err := svc.SetTopology(ctx, op, req, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	req.ExpectedTopologyGen = gen(2)
	if _, err := svc.SetTopology(ctx, op, req, capacity.RequestMeta{}); code(err) != capacity.CodeIdempotencyKeyReused {
		t.Errorf("same key, other expected generation: %v, want idempotency_key_reused", err)
	}
}

// racingOps runs before() once, just before the first operator commit it passes on: a
// concurrent write between the decision's read and its commit.
type racingOps struct {
	capacity.Store
	ops    capacity.OperatorStore
	before func()
	done   bool
}

func (s *racingOps) LoadNodeOrNew(ctx context.Context, id, scope string) (*capacity.NodeState, error) {
	return s.ops.LoadNodeOrNew(ctx, id, scope)
}
func (s *racingOps) GetNode(ctx context.Context, id string) (*capacity.Node, error) {
	return s.ops.GetNode(ctx, id)
}
func (s *racingOps) ListReservations(ctx context.Context, id string, limit int, after string) ([]capacity.Reservation, bool, error) {
	return s.ops.ListReservations(ctx, id, limit, after)
}
func (s *racingOps) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	if !s.done {
		s.done = true
		s.before()
	}
	return s.ops.CommitOperator(ctx, c)
}

// lostAnswerOps reports every operator commit that landed as ambiguous (its answer lost).
type lostAnswerOps struct{ racingOps }

func (s *lostAnswerOps) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	if _, err := s.racingOps.CommitOperator(ctx, c); err != nil {
		return capacity.AuditHead{}, err
	}
	return capacity.AuditHead{}, capacity.ErrAmbiguous
}

// A record is appended to the node's changes chain (by a commit that changes nothing) between
// a topology change's read and its commit, which the store then chains on the moved head; the commit's answer is lost and it is found to have landed.
// The answer's audit head is the node's, not one computed from the head the decision read.
func TestLandedOperatorCommitAnswersTheStoredHead(t *testing.T) {
	env, svc := world(t)
	ctx := context.Background()
	svc.Store = &lostAnswerOps{racingOps{Store: env.Store, ops: env.Store, before: func() {
		st, err := env.Store.LoadNode(ctx, "n1", "")
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Store.Commit(ctx, capacity.Commit{Node: st.Node, Audit: capacity.AuditRecord{ID: "no-op", Time: t0, NodeID: "n1",
			Action: capacity.ActionRelease, Outcome: "ok"}}); err != nil {
			t.Errorf("concurrent commit: %v", err)
		}
	}}}
	res, err := svc.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := env.Store.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if res.Node.AuditHead != n.AuditHead || n.AuditHead.Seq != 2 {
		t.Errorf("answered head %+v, stored %+v (want seq 2: the append, then the change)", res.Node.AuditHead, n.AuditHead)
	}
}

func TestOperatorWritesRedecideAfterARace(t *testing.T) {
	end := t0.Add(48 * time.Hour)
	tests := []struct {
		name   string
		race   func(ctx context.Context, other *capacity.Service) error
		call   func(ctx context.Context, svc *capacity.Service) error
		want   capacity.Code
		verify func(t *testing.T, st *capacity.NodeState)
	}{
		{
			name: "two creates on one unit: the second re-decides and is refused",
			race: func(ctx context.Context, o *capacity.Service) error {
				_, err := o.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rA", StartsAt: t0, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				return err
			},
			call: func(ctx context.Context, s *capacity.Service) error {
				_, err := s.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rB", StartsAt: t0, EndsAt: &end, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				return err
			},
			want: capacity.CodeReservationOverlap,
			verify: func(t *testing.T, st *capacity.NodeState) {
				if st.Reservation("rA") == nil || st.Reservation("rB") != nil {
					t.Errorf("reservations %v: want rA only", st.Reservations)
				}
			},
		},
		{
			name: "a topology change during a reaffirm-free create: the reservation takes the new gen",
			race: func(ctx context.Context, o *capacity.Service) error {
				_, err := o.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}}, capacity.RequestMeta{})
				return err
			},
			call: func(ctx context.Context, s *capacity.Service) error {
				_, err := s.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rB", StartsAt: t0, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				return err
			},
			verify: func(t *testing.T, st *capacity.NodeState) {
				if r := st.Reservation("rB"); r == nil || r.TopologyGen != 2 {
					t.Errorf("rB = %+v, want created at gen 2", r)
				}
			},
		},
		{
			name: "a cancel racing a topology change: r1 ends cancelled, not needs-review",
			race: func(ctx context.Context, o *capacity.Service) error {
				_, err := o.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
				return err
			},
			call: func(ctx context.Context, s *capacity.Service) error {
				res, err := s.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1"}}, capacity.RequestMeta{})
				if err == nil && len(res.NeedsReview) != 0 {
					t.Errorf("needsReview %v after r1 was cancelled", res.NeedsReview)
				}
				return err
			},
			verify: func(t *testing.T, st *capacity.NodeState) {
				if r := st.Reservation("r1"); r.Status != capacity.StatusCancelled || st.Node.TopologyGen != 2 {
					t.Errorf("r1 %s, node gen %d", r.Status, st.Node.TopologyGen)
				}
			},
		},
		{
			name: "a placement racing a create: the new VM's unit is in use",
			race: func(ctx context.Context, o *capacity.Service) error {
				_, err := o.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "od1", OrgID: "buyer", Tier: capacity.TierOnDemand, UnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				return err
			},
			call: func(ctx context.Context, s *capacity.Service) error {
				_, err := s.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: "rB", StartsAt: t0, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
				return err
			},
			want: capacity.CodeUnitsInUse,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			ctx := context.Background()
			other := &capacity.Service{Store: env.Store, Now: svc.Now, Logger: quiet}
			svc.Store = &racingOps{Store: env.Store, ops: env.Store, before: func() {
				if err := tt.race(ctx, other); err != nil {
					t.Errorf("racing write: %v", err)
				}
			}}
			if err := tt.call(ctx, svc); code(err) != tt.want {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			if tt.verify != nil {
				tt.verify(t, st)
			}
			for _, v := range append(capacity.Violations(st, t0.Add(time.Hour)), capacity.OverlapViolations(st, t0.Add(time.Hour))...) {
				t.Error(v)
			}
		})
	}
}

func TestOperatorWriteThrottledWritesNothing(t *testing.T) {
	env, svc, inj := faultyWorld(t, 7, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1})
	before := stateItems(t, env)
	_, err := svc.SetTopology(context.Background(), op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{})
	if code(err) != capacity.CodeThrottled {
		t.Fatalf("got %v, want throttled", err)
	}
	if inj.Count(awsfault.Throttling) == 0 {
		t.Fatal("nothing injected")
	}
	if !reflect.DeepEqual(stateItems(t, env), before) {
		t.Error("a throttled call wrote")
	}
}

// TestAmbiguousNodeCreate: the registration's transaction lands and its answer is lost. The
// call still answers created (with the agent key), and a retry under the same key replays
// it: one node, one create audited, and the replay on record as such.
func TestAmbiguousNodeCreate(t *testing.T) {
	env, svc, inj := faultyWorld(t, 3, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1})
	svc.AgentKeySealer = &testSealer{}
	ctx := context.Background()
	req := capacity.NodeRequest{NodeID: "n7", OwnerOrgID: "acme", UnitIDs: []string{"g0"}, AgentEndpoint: "https://n7", IdempotencyKey: "reg-7"}
	res, err := svc.PutNode(ctx, op, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if inj.Count(awsfault.AmbiguousTimeout) == 0 {
		t.Fatal("nothing injected")
	}
	if !res.Created || len(res.AgentKey) != capacity.AgentKeyBytes {
		t.Fatalf("ambiguous create answered %+v", res)
	}
	again, err := svc.PutNode(ctx, op, req, capacity.RequestMeta{})
	if err != nil || !again.Replayed || !again.Created || !again.SecretShown || again.AgentKey != nil {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if got := opAudits(t, env); !reflect.DeepEqual(got, []string{"node.put:ok", "node.put:replayed"}) {
		t.Errorf("audit = %v, want one node.put and its replay", got)
	}
}

// listWorld is world plus ra (no audience), rb (managed by mgr) and rc (audience aud), all
// on u3 at later terms.
func listWorld(t *testing.T) (*dynamotest.Env, *capacity.Service) {
	t.Helper()
	env, svc := world(t)
	ctx := context.Background()
	for i, id := range []string{"ra", "rb", "rc"} {
		start := t0.Add(time.Duration(i+1) * 1000 * time.Hour)
		end := start.Add(time.Hour)
		managing, allowed := []string{}, []string{}
		switch id {
		case "rb":
			managing = []string{"mgr"}
		case "rc":
			allowed = []string{"aud"}
		}
		if _, err := svc.CreateReservation(ctx, op, capacity.ReservationRequest{NodeID: "n1", ID: id, StartsAt: start, EndsAt: &end,
			AllowedOrgIDs: allowed, ManagingOrgIDs: managing, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	return env, svc
}

func read(org string) capacity.Principal {
	return capacity.Principal{OrgID: org, Permissions: []string{capacity.PermRead}}
}

func TestListReservations(t *testing.T) {
	env, svc := listWorld(t)
	ctx := context.Background()
	tests := []struct {
		name  string
		p     capacity.Principal
		limit int
		want  []string
		code  capacity.Code
	}{
		{"operator, pages of 2", op, 2, []string{"r1", "ra", "rb", "rc"}, ""},
		{"owner sees all", read("owner"), 0, []string{"r1", "ra", "rb", "rc"}, ""},
		{"audience sees its own, pages of 1", read("aud"), 1, []string{"r1", "rc"}, ""},
		{"audience sees its own", read("aud"), 0, []string{"r1", "rc"}, ""},
		{"manager sees its own", read("mgr"), 3, []string{"rb"}, ""},
		{"manager sees its own, pages of 1", read("mgr"), 1, []string{"rb"}, ""},
		{"no read permission", owner, 0, nil, capacity.CodeNotFound},
		// Nothing on the node is for it: the same 404 as a missing node.
		{"read permission, nothing visible", read("stranger"), 0, nil, capacity.CodeNotFound},
		{"read permission, nothing visible, pages of 1", read("stranger"), 1, nil, capacity.CodeNotFound},
		{"limit too big", op, 101, nil, capacity.CodeInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			cursor := ""
			for pages := 0; ; pages++ {
				page, err := svc.ListReservations(ctx, tt.p, "n1", capacity.PageRequest{Limit: tt.limit, Cursor: cursor})
				if code(err) != tt.code {
					t.Fatalf("got %v, want %q", err, tt.code)
				}
				if err != nil {
					return
				}
				if tt.limit > 0 && len(page.Reservations) > tt.limit || pages > 10 {
					t.Fatalf("page of %d, limit %d", len(page.Reservations), tt.limit)
				}
				if len(page.Reservations) == 0 {
					t.Fatalf("an empty page (cursor %q)", cursor)
				}
				for _, r := range page.Reservations {
					got = append(got, r.ID)
				}
				if cursor = page.NextCursor; cursor == "" {
					break
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("listed %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := svc.ListReservations(ctx, op, "n1", capacity.PageRequest{Cursor: "garbage"}); code(err) != capacity.CodeInvalidRequest {
		t.Errorf("garbage cursor: %v", err)
	}
	if _, err := svc.ListReservations(ctx, op, "nx", capacity.PageRequest{}); code(err) != capacity.CodeNotFound {
		t.Errorf("missing node: %v", err)
	}
	// A cursor of the node (here an operator's) tells a stranger nothing either.
	first, err := svc.ListReservations(ctx, op, "n1", capacity.PageRequest{Limit: 1})
	if err != nil || first.NextCursor == "" {
		t.Fatalf("operator page = %+v, %v", first, err)
	}
	if _, err := svc.ListReservations(ctx, read("stranger"), "n1", capacity.PageRequest{Cursor: first.NextCursor}); code(err) != capacity.CodeNotFound {
		t.Errorf("stranger with a cursor: %v, want not_found", err)
	}
	_ = env
}

// A reservation list's cursor names nothing the caller may not see: for every caller and
// page size, no cursor holds (read as it is or decoded) the id of a reservation hidden from
// that caller.
func TestListReservationsCursorsNameOnlyWhatWasShown(t *testing.T) {
	_, svc := listWorld(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		p      capacity.Principal
		hidden []string
	}{
		{"audience", read("aud"), []string{"ra", "rb"}},
		{"manager", read("mgr"), []string{"r1", "ra", "rc"}},
		{"owner", read("owner"), nil},
	}
	for _, tt := range tests {
		for _, limit := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, limit), func(t *testing.T) {
				for cursor, pages := "", 0; pages < 10; pages++ {
					page, err := svc.ListReservations(ctx, tt.p, "n1", capacity.PageRequest{Limit: limit, Cursor: cursor})
					if err != nil {
						t.Fatal(err)
					}
					if cursor = page.NextCursor; cursor == "" {
						break
					}
					decoded, _ := base64.RawURLEncoding.DecodeString(cursor)
					for _, id := range tt.hidden {
						if strings.Contains(cursor, id) || strings.Contains(string(decoded), `"`+id+`"`) || strings.Contains(string(decoded), "#"+id) {
							t.Errorf("cursor %q (%s) names hidden reservation %s", cursor, decoded, id)
						}
					}
				}
			})
		}
	}
}

// A caller who may not list the node's reservations (no reservation.read, or nothing on the
// node for it) gets the one 404 of a missing node whatever its cursor says: garbage, another
// node's cursor, an operator's cursor of this node, one naming a reservation hidden from it,
// or a cursor made before cursors changed. A caller who may list gets 422 for a bad cursor.
func TestListReservationsCursorTellsNothing(t *testing.T) {
	_, svc := listWorld(t)
	ctx := context.Background()
	opPage, err := svc.ListReservations(ctx, op, "n1", capacity.PageRequest{Limit: 1})
	if err != nil || opPage.NextCursor == "" {
		t.Fatalf("operator page %+v, %v", opPage, err)
	}
	made := func(text string) string { return base64.RawURLEncoding.EncodeToString([]byte(text)) }
	cursors := map[string]string{
		"none":                 "",
		"garbage":              "garbage!",
		"an operator's cursor": opPage.NextCursor,
		"another node's":       made(`["v1","reservations","n2","r1"]`),
		"naming a hidden one":  made(`["v1","reservations","n1","ra"]`),
		"of the old format":    made(`{"pk":"NODE#n1","sk":"RES#ra"}`),
		"of another list":      made(`["v1","keys","key-1"]`),
	}
	notFound := func(t *testing.T, p capacity.Principal, node, cursor string) {
		t.Helper()
		_, err := svc.ListReservations(ctx, p, node, capacity.PageRequest{Cursor: cursor})
		if code(err) != capacity.CodeNotFound || capacity.ErrorMessage(err) != "node not found" {
			t.Errorf("got %v, want the node's 404", err)
		}
	}
	for name, cursor := range cursors {
		t.Run(name, func(t *testing.T) {
			notFound(t, read("stranger"), "n1", cursor)
			notFound(t, owner, "n1", cursor) // capacity but no read permission
			notFound(t, read("stranger"), "n404", cursor)
			// The audience sees r1 and rc: a cursor past them is an empty page, a bad one 422.
			page, err := svc.ListReservations(ctx, read("aud"), "n1", capacity.PageRequest{Cursor: cursor})
			switch name {
			case "garbage", "another node's", "of the old format", "of another list":
				if code(err) != capacity.CodeInvalidRequest {
					t.Errorf("audience: %v, want invalid_request", err)
				}
			default:
				if err != nil || page == nil {
					t.Errorf("audience: %+v, %v", page, err)
				}
			}
		})
	}
}

func TestViolationsOfTheLifecycle(t *testing.T) {
	node := capacity.Node{ID: "n1", UnitIDs: []string{"u0", "u1"}, TopologyGen: 2}
	end := t0.Add(10 * time.Hour)
	res := func(id string, status capacity.Status, start time.Time, end *time.Time, units ...string) capacity.Reservation {
		return capacity.Reservation{ID: id, NodeID: "n1", Status: status, StartsAt: start, EndsAt: end, ReservedUnitIDs: units, TopologyGen: 2}
	}
	tests := []struct {
		name string
		rs   []capacity.Reservation
		want int
	}{
		{"active on a removed unit", []capacity.Reservation{res("a", capacity.StatusActive, t0, nil, "u9")}, 1},
		{"needs-review on a removed unit", []capacity.Reservation{res("a", capacity.StatusNeedsReview, t0, nil, "u9")}, 0},
		{"expired on a removed unit", []capacity.Reservation{res("a", capacity.StatusActive, t0, &t0Plus1h, "u9")}, 0},
		{"overlapping claims", []capacity.Reservation{res("a", capacity.StatusActive, t0, nil, "u0"), res("b", capacity.StatusPending, t0.Add(5*time.Hour), nil, "u0")}, 1},
		{"needs-review and active overlap", []capacity.Reservation{res("a", capacity.StatusNeedsReview, t0, &end, "u0"), res("b", capacity.StatusActive, t0, nil, "u0")}, 1},
		{"consecutive terms", []capacity.Reservation{res("a", capacity.StatusActive, t0, &end, "u0"), res("b", capacity.StatusActive, end, nil, "u0")}, 0},
		{"cancelled does not claim", []capacity.Reservation{res("a", capacity.StatusCancelled, t0, nil, "u0"), res("b", capacity.StatusActive, t0, nil, "u0")}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &capacity.NodeState{Node: node, Reservations: tt.rs}
			got := append(capacity.Violations(st, t0.Add(2*time.Hour)), capacity.OverlapViolations(st, t0.Add(2*time.Hour))...)
			if len(got) != tt.want {
				t.Errorf("violations %v, want %d", got, tt.want)
			}
		})
	}
}

var t0Plus1h = t0.Add(time.Hour)

// TestEndAgentKeyOverlap: an operator ends the overlap of a node's key generation early (after a
// leak of the previous key): the node records the generation whose previous key is never used
// again, the call is audited, a replay answers the same, and nobody else can (404, nothing
// written). A later rotation begins a new overlap.
func TestEndAgentKeyOverlap(t *testing.T) {
	env, svc := world(t)
	svc.AgentKeySealer = &testSealer{}
	ctx := context.Background()
	if _, err := svc.PutNode(ctx, op, capacity.NodeRequest{NodeID: "n2", OwnerOrgID: "acme", UnitIDs: []string{"g0"}, AgentEndpoint: "https://n2"}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	rot, err := svc.RotateAgentKey(ctx, op, capacity.AgentKeyRotation{NodeID: "n2"}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	before := stateItems(t, env)
	for _, p := range []capacity.Principal{
		{OrgID: "acme", Permissions: []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}}, // the owner
		{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity, capacity.PermRead}}, // no node.manage
	} {
		if _, err := svc.EndAgentKeyOverlap(ctx, p, capacity.AgentKeyRotation{NodeID: "n2"}, capacity.RequestMeta{}); code(err) != capacity.CodeNotFound {
			t.Errorf("end by %s: %v, want not_found", p.OrgID, err)
		}
	}
	if !reflect.DeepEqual(stateItems(t, env), before) {
		t.Fatal("a refused end wrote")
	}

	req := capacity.AgentKeyRotation{NodeID: "n2", Reason: "previous key leaked", IdempotencyKey: "end-1"}
	res, err := svc.EndAgentKeyOverlap(ctx, op, req, capacity.RequestMeta{})
	if err != nil || res.Gen != rot.Gen || !res.PreviousValidUntil.Equal(svc.Now()) || res.AgentKey != nil {
		t.Fatalf("end = %+v, %v; want generation %d, previous key until now", res, err, rot.Gen)
	}
	n, err := env.Store.GetNode(ctx, "n2")
	if err != nil || n.AgentKeyOverlapEndedGen != rot.Gen || n.AgentKeyGen != rot.Gen || !bytes.Equal(n.AgentKey, sealedFor("n2", rot.AgentKey)) {
		t.Fatalf("stored = %+v, %v; want the overlap of generation %d ended, the key unchanged", n, err, rot.Gen)
	}
	if again, err := svc.EndAgentKeyOverlap(ctx, op, req, capacity.RequestMeta{}); err != nil || !again.Replayed || again.Gen != rot.Gen {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	// A later rotation moves past the generation whose overlap was ended.
	next, err := svc.RotateAgentKey(ctx, op, capacity.AgentKeyRotation{NodeID: "n2"}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := env.Store.GetNode(ctx, "n2"); err != nil || n.AgentKeyGen != next.Gen || n.AgentKeyOverlapEndedGen == n.AgentKeyGen {
		t.Fatalf("after a new rotation: %+v, %v; want a new overlap", n, err)
	}
	want := []string{"node.agent-key.end-overlap:ok", "node.agent-key.end-overlap:replayed", "node.agent-key.rotate:ok", "node.agent-key.rotate:ok", "node.put:ok"}
	if got := opAudits(t, env); !reflect.DeepEqual(got, want) {
		t.Errorf("audit = %v, want %v", got, want)
	}
}
