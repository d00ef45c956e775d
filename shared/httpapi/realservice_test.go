package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// ---------------------------------------------------------------------------------------
// The real domain service behind the handler, over an in-memory store.

// memStore is an in-memory capacity.Store: one node state per node id, conditioned commits.
type memStore struct {
	mu     sync.Mutex
	nodes  map[string]*capacity.NodeState
	idem   map[string]*capacity.IdempotencyRecord
	audits []capacity.AuditRecord
}

// clone deep-copies v, so the service never shares memory with the store.
func clone[T any](v T) T {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

func (s *memStore) LoadNode(_ context.Context, nodeID, scope string) (*capacity.NodeState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.nodes[nodeID]
	if !ok {
		return nil, capacity.Errorf(capacity.CodeNotFound, "node %s not found", nodeID)
	}
	out := clone(st)
	if scope != "" {
		if rec, ok := s.idem[scope]; ok {
			out.Idempotency = clone(rec)
		}
	}
	return out, nil
}

func (s *memStore) Commit(_ context.Context, c capacity.Commit) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.nodes[c.Node.ID]
	if st == nil || st.Node.Version != c.Node.Version {
		return fmt.Errorf("commit: %w", capacity.ErrConflict)
	}
	if c.BumpNode {
		st.Node.Version++
	}
	if c.Reservation != nil {
		r := st.Reservation(c.Reservation.ID)
		if r == nil || r.Version != c.Reservation.Version {
			return fmt.Errorf("commit: %w", capacity.ErrConflict)
		}
		*r = *c.Reservation
		r.Version++
	}
	for _, ev := range c.Evict {
		for i := range st.VMs {
			if st.VMs[i].ID == ev.ID {
				st.VMs[i].State = capacity.VMTerminating
				st.VMs[i].ReclaimID = c.Operation.ID
				st.VMs[i].Version++
			}
		}
	}
	if c.NewVM != nil {
		st.VMs = append(st.VMs, *c.NewVM)
	}
	if c.Idempotency != nil {
		s.idem[c.Idempotency.Scope] = c.Idempotency
	}
	s.audits = append(s.audits, c.Audit)
	return nil
}

func (s *memStore) GetOperation(context.Context, string, string) (*capacity.Operation, error) {
	return nil, capacity.Errorf(capacity.CodeNotFound, "no operations in this fake")
}

func (s *memStore) RedriveOperation(context.Context, capacity.Operation, capacity.AuditRecord, time.Time) error {
	return capacity.Errorf(capacity.CodeNotFound, "no operations in this fake")
}

// Landed finds the commit's audit record, as the DynamoDB store does (this store's commits
// never fail ambiguously, but a wrapper in a test may make them).
func (s *memStore) Landed(_ context.Context, c capacity.Commit) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.audits, func(a capacity.AuditRecord) bool { return a.ID == c.Audit.ID }), nil
}

func (s *memStore) AppendAudit(_ context.Context, rec capacity.AuditRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.audits = append(s.audits, rec)
	return nil
}

func (s *memStore) RecordUnchanged(_ context.Context, rec capacity.AuditRecord, idem *capacity.IdempotencyRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if idem != nil {
		s.idem[idem.Scope] = idem
	}
	s.audits = append(s.audits, rec)
	return nil
}

// newRealHandler serves the real capacity.Service over a node n1 of units u0..u7 with one
// open-ended active reservation r1 of u0..u5 (audience "aud", managed by "mgr", u2..u5
// released), and VMs: vm-res (reserved, u0), vm-spot-a (spot, u2), vm-spot-b (spot, u3).
func newRealHandler(t *testing.T) (http.Handler, *memStore) {
	t.Helper()
	svc, store := newRealService()
	return newHandler(svc), store
}

// newRealService is the real capacity.Service of newRealHandler, over its store.
func newRealService() (*capacity.Service, *memStore) {
	store := &memStore{
		nodes: map[string]*capacity.NodeState{"n1": {
			Node: capacity.Node{ID: "n1", OwnerOrgID: "owner", TopologyGen: 3,
				UnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}, Version: 10},
			Reservations: []capacity.Reservation{{
				ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"},
				ReservedUnitIDs: []string{"u0", "u1", "u2", "u3", "u4", "u5"}, ReleasedUnitIDs: []string{"u2", "u3", "u4", "u5"},
				StartsAt: t0, Status: capacity.StatusActive, TopologyGen: 3, Version: 4, CreatedAt: t0, UpdatedAt: t0,
			}},
			VMs: []capacity.VM{
				{ID: "vm-res", NodeID: "n1", OrgID: "aud", Tier: capacity.TierReserved, UnitIDs: []string{"u0"}, State: capacity.VMRunning, Version: 1},
				{ID: "vm-spot-a", NodeID: "n1", OrgID: "x", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}, State: capacity.VMRunning, Version: 1},
				{ID: "vm-spot-b", NodeID: "n1", OrgID: "y", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMRunning, Version: 1},
			},
		}},
		idem: map[string]*capacity.IdempotencyRecord{},
	}
	var n int
	var mu sync.Mutex
	svc := &capacity.Service{
		Store:  store,
		Now:    func() time.Time { return now },
		Logger: quiet,
		NewID: func() string {
			mu.Lock()
			defer mu.Unlock()
			n++
			return fmt.Sprintf("id%d", n)
		},
	}
	return svc, store
}

func TestNotFoundIsIndistinguishable(t *testing.T) {
	body := `{"unitIds":["u2"]}`
	groups := []struct {
		name  string
		cases []req
	}{
		{"reclaim", []req{
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretNoRights), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n9/reservations/r1/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r!/reclaim", body: body},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodPost, path: reclaimPath, body: body},
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/reclaim", body: `{"unitIds":[]}`},
		}},
		{"release", []req{
			{auth: ptr("Bearer " + secretNoPerm), method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/r9/release", body: `{"unitIds":["u1"]}`},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodPost, path: releasePath, body: `{"unitIds":["u1"]}`},
		}},
		{"get", []req{
			{auth: ptr("Bearer " + secretNoRights), method: http.MethodGet, path: reservationPath},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/r9"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n9/reservations/r1"},
			{auth: ptr("Bearer " + secretStranger), method: http.MethodGet, path: reservationPath},
			// Malformed path ids name nothing, on every reservation route.
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/" + strings.Repeat("r", 2048)},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n1/reservations/%2E%2E"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/" + strings.Repeat("x", 2048)},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/rcl%2F1"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: reservationPath + "/reclaims/%2E%2E"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodGet, path: "/v1/nodes/n%201/reservations/r1/reclaims/rcl_1"},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/" + strings.Repeat("n", 129) + "/reservations/r1/reclaim", body: body},
			{auth: ptr("Bearer " + secretOwner), method: http.MethodPost, path: "/v1/nodes/n1/reservations/-r1/release", body: body},
		}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			h, store := newRealHandler(t)
			var first *httptest.ResponseRecorder
			for i, q := range g.cases {
				w := q.do(t, h)
				problem(t, w, http.StatusNotFound, capacity.CodeNotFound)
				if first == nil {
					first = w
					continue
				}
				if !bytes.Equal(w.Body.Bytes(), first.Body.Bytes()) {
					t.Errorf("case %d body differs:\n%s\nvs case 0:\n%s", i, w.Body.String(), first.Body.String())
				}
				a, b := first.Header().Clone(), w.Header().Clone()
				if a.Get("X-Request-Id") == "" || b.Get("X-Request-Id") == "" {
					t.Errorf("X-Request-Id missing")
				}
				a.Del("X-Request-Id")
				b.Del("X-Request-Id")
				if !reflect.DeepEqual(a, b) {
					t.Errorf("case %d headers differ: %v vs case 0: %v", i, b, a)
				}
			}
			if len(store.audits) != 0 {
				t.Errorf("404s were audited against the reservation: %+v", store.audits)
			}
		})
	}
}

func TestAudienceGets403(t *testing.T) {
	h, _ := newRealHandler(t)
	w := req{auth: ptr("Bearer " + secretAudience), method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2"]}`}.do(t, h)
	problem(t, w, http.StatusForbidden, capacity.CodeForbidden)
	// The audience may still read the reservation.
	w = req{auth: ptr("Bearer " + secretAudience), method: http.MethodGet, path: reservationPath}.do(t, h)
	if w.Code != http.StatusOK {
		t.Fatalf("GET as audience = %d: %s", w.Code, w.Body.String())
	}
}

func TestReclaimThroughTheRealService(t *testing.T) {
	h, store := newRealHandler(t)
	reclaim := func(body, key string) *httptest.ResponseRecorder {
		q := req{method: http.MethodPost, path: reclaimPath, body: body}
		if key != "" {
			q.header = map[string]string{"Idempotency-Key": key}
		}
		return q.do(t, h)
	}

	// A dry run reports and changes nothing.
	w := reclaim(`{"unitIds":["u0","u2"],"dryRun":true,"reason":"préemption 🚀"}`, "")
	if w.Code != http.StatusOK {
		t.Fatalf("dry run = %d: %s", w.Code, w.Body.String())
	}
	m := jsonObject(t, w)
	if got := stringsField(t, m, "wouldTerminate"); !slices.Equal(got, []string{"vm-spot-a"}) {
		t.Errorf("wouldTerminate = %v", got)
	}
	if got := stringsField(t, m, "wouldSkip"); !slices.Equal(got, []string{"vm-res"}) {
		t.Errorf("wouldSkip = %v", got)
	}
	if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u2", "u3", "u4", "u5"}) {
		t.Errorf("dry run releasedUnitIds = %v, want unchanged", got)
	}
	assertAbsent(t, m, "terminated", "skipped", "reclaimId", "endsAt")
	if st := store.nodes["n1"]; st.Node.Version != 10 || st.VMs[1].State != capacity.VMRunning {
		t.Fatalf("dry run changed the store: %+v", st)
	}

	// The real reclaim evicts, and a retry with the same key replays the same answer.
	body := `{"unitIds":["u0","u2"],"reason":"customer needs them"}`
	w = reclaim(body, "k-1")
	if w.Code != http.StatusOK {
		t.Fatalf("reclaim = %d: %s", w.Code, w.Body.String())
	}
	if got := w.Header().Get("Idempotent-Replayed"); got != "" {
		t.Errorf("first call Idempotent-Replayed = %q", got)
	}
	m = jsonObject(t, w)
	if got := stringsField(t, m, "terminated"); !slices.Equal(got, []string{"vm-spot-a"}) {
		t.Errorf("terminated = %v", got)
	}
	if got := stringsField(t, m, "skipped"); !slices.Equal(got, []string{"vm-res"}) {
		t.Errorf("skipped = %v", got)
	}
	if got := stringsField(t, m, "releasedUnitIds"); !slices.Equal(got, []string{"u3", "u4", "u5"}) {
		t.Errorf("releasedUnitIds = %v", got)
	}
	var reclaimID string
	if err := json.Unmarshal(m["reclaimId"], &reclaimID); err != nil || !strings.HasPrefix(reclaimID, "rcl_") {
		t.Errorf("reclaimId = %s, want rcl_…", m["reclaimId"])
	}
	assertAbsent(t, m, "wouldTerminate", "wouldSkip", "endsAt")
	if vm := store.nodes["n1"].VMs[1]; vm.State != capacity.VMTerminating || vm.ReclaimID != reclaimID {
		t.Errorf("evicted VM = %+v", vm)
	}

	replay := reclaim(body, "k-1")
	if replay.Code != http.StatusOK || replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %d, Idempotent-Replayed %q: %s", replay.Code, replay.Header().Get("Idempotent-Replayed"), replay.Body.String())
	}
	if !bytes.Equal(replay.Body.Bytes(), w.Body.Bytes()) {
		t.Errorf("replayed body differs:\n%s\nfirst:\n%s", replay.Body.String(), w.Body.String())
	}

	// The same key for a different request is refused.
	w = reclaim(`{"unitIds":["u3"]}`, "k-1")
	problem(t, w, http.StatusUnprocessableEntity, capacity.CodeIdempotencyKeyReused)

	// Units outside the reservation name themselves in the problem.
	w = reclaim(`{"unitIds":["u3","u7"]}`, "")
	p := problem(t, w, http.StatusUnprocessableEntity, capacity.CodeUnitsNotReserved)
	if !slices.Equal(p.UnitIDs, []string{"u7"}) {
		t.Errorf("unitIds = %v, want [u7]", p.UnitIDs)
	}

	// Validation errors reach a caller with the permission as 422.
	for _, b := range []string{`{"unitIds":[]}`, `{"unitIds":["u1","u1"]}`, `{"unitIds":["bad id"]}`} {
		problem(t, reclaim(b, ""), http.StatusUnprocessableEntity, capacity.CodeInvalidRequest)
	}
}
