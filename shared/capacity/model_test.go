package capacity_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/table"
)

// The model-based test: rapid draws sequences of calls over several nodes and reservations
// (reclaim, release, placement, termination, re-drive, topology, reaffirm, cancel,
// reservation terms passing, scheduled reclaims, key revocation, duplicate deliveries), runs
// each through the Service on the store on the in-process emulator, predicts each answer with
// a small reference model (plain maps of nodes, reservations, VMs, operations and scheduled
// reclaims, with the rules of docs/api.md written out again), and after every step checks every
// invariant (capacity.Violations, OverlapViolations) and that the store holds what the model
// holds. A failing run prints rapid's seed and the shrunk sequence of steps; replay it with
//
//	go test ./shared/capacity -run '^TestModel$' -rapid.seed=<seed>
//
// (or -rapid.failfile=<file> as rapid prints). The same test scales: `make test` runs it
// short (TestModel: 10 sequences unless -rapid.checks says otherwise, of about -rapid.steps
// steps), `make soak` runs TestModelSoak for at least MODEL_OPS operations (see docs/numbers.md,
// "Reliability").

// modelTables gives each rapid check a fresh set of tables on one emulator: an emulator per
// check would outlive its check (dynamotest.New cleans up at the end of the test).
type modelTables struct {
	env *dynamotest.Env
	seq atomic.Int64
	// faults, if any, are injected into the service's calls to DynamoDB (not the setup's,
	// the checks', nor the terminator's), with a seed each sequence draws.
	faults []awsfault.Rule
}

// modelFaults are the AWS faults of a run under faults: transactions cancelled by a conflict,
// throttled, and applied with their answer lost (a timeout, a 500).
var modelFaults = []awsfault.Rule{
	{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.05},
	{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 0.05},
	{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 0.05},
	{Operation: "TransactWriteItems", Fault: awsfault.InternalServerError, Rate: 0.03},
}

// faulted returns store with its client under mt's faults, drawn from seed.
func (mt *modelTables) faulted(store *dynamo.Store, seed int64) (*dynamo.Store, *awsfault.Injector) {
	inj := awsfault.New(seed, mt.faults...)
	client := dynamodb.New(mt.env.Plain.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, inj.APIOption) })
	out := dynamo.New(client, store.Table, store.AuditTable)
	out.KeysTable = store.KeysTable
	return out, inj
}

func (mt *modelTables) fresh(t *rapid.T) (*dynamo.Store, func()) {
	ctx := context.Background()
	name := fmt.Sprintf("model%d", mt.seq.Add(1))
	var names []string
	for _, tb := range table.All {
		n := tb.Name(name)
		if err := dynamotest.CreateTable(ctx, mt.env.Plain, tb, n); err != nil {
			t.Fatalf("create tables: %v", err)
		}
		names = append(names, n)
	}
	store := dynamo.New(mt.env.Plain, table.State.Name(name), table.Audit.Name(name))
	store.KeysTable = table.Keys.Name(name)
	return store, func() {
		for _, n := range names {
			_, _ = mt.env.Plain.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &n})
		}
	}
}

// Orgs and callers of the model's world.
var (
	mOperator = capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}
	mPlacer   = capacity.Principal{KeyID: "k-sched", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermPlace}}
	mOwnerA   = capacity.Principal{KeyID: "k-own-a", OrgID: "own-a", Permissions: []string{capacity.PermCapacity}}
	mOwnerB   = capacity.Principal{KeyID: "k-own-b", OrgID: "own-b", Permissions: []string{capacity.PermCapacity}}
	mManager  = capacity.Principal{KeyID: "k-mgr", OrgID: "mgr", Permissions: []string{capacity.PermCapacity}}
	mAudience = capacity.Principal{KeyID: "k-aud", OrgID: "aud", Permissions: []string{capacity.PermCapacity}}
	mStranger = capacity.Principal{KeyID: "k-str", OrgID: "str", Permissions: []string{capacity.PermCapacity}}
	mNoPerm   = capacity.Principal{KeyID: "k-np", OrgID: "mgr", Permissions: []string{capacity.PermRead}}
	// mFleet is the event source of topology changes.
	mFleet = capacity.Principal{KeyID: "event:fleet", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermTopology}}
	// mSource is an event source acting for the managing org (events act as their source).
	mSource = capacity.Principal{KeyID: "event:mgr.source", OrgID: "mgr", Permissions: []string{capacity.PermCapacity}}

	// mCallers of capacity calls: those who may move capacity first (rapid draws the first
	// ones most often).
	mCallers = []capacity.Principal{mManager, mOwnerA, mOperator, mOwnerB, mAudience, mStranger, mNoPerm}

	// mCreators schedule reclaims: keys of their own, which the model revokes (a scheduled
	// reclaim runs as the key that created it, and only while that key still could).
	mCreators = []capacity.Principal{
		{KeyID: "k-c-mgr", OrgID: "mgr", Permissions: []string{capacity.PermCapacity}},
		{KeyID: "k-c-own", OrgID: "own-a", Permissions: []string{capacity.PermCapacity}},
		{KeyID: "k-c-op", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity}},
		{KeyID: "k-c-aud", OrgID: "aud", Permissions: []string{capacity.PermCapacity}},
	}
)

// The model's world: nodes n1, n2 (owner own-a) and n3 (own-b), four units each to start.
var mNodeIDs = []string{"n1", "n2", "n3"}

type mNode struct {
	owner   string
	units   []string
	gen     int64
	version int64
	nextU   int // the next new unit's number
	usedVMs map[string]bool
}

type mRes struct {
	id, node          string
	units, released   []string
	allowed, managing []string
	status            capacity.Status
	start             time.Time
	end               *time.Time
	gen, version      int64
}

type mVM struct {
	id, node, org string
	tier          capacity.Tier
	units         []string
	state         capacity.VMState
	reclaim       string
}

// mSched is a scheduled reclaim.
type mSched struct {
	id, node, res string
	units         []string
	grace         int
	at            time.Time
	creator       capacity.Principal
	state         capacity.ScheduledState
	code          capacity.Code // why it was refused
	reclaimID     string        // of its firing
	// loose: the model's last move of it (a refusal, its reservation's cancel) is a write the
	// service makes on a best effort (it logs a failure; a later firing refuses it again),
	// which under AWS faults may not have landed: the store may still say scheduled.
	loose bool
}

type mOutcome struct {
	outcome capacity.Outcome
	attempt int
}

type mOp struct {
	id, node, res string
	vms           []string
	state         capacity.OperationState
	attempt       int
	outcomes      map[string]mOutcome
}

func (o *mOp) final(vm string) (mOutcome, bool) {
	out, ok := o.outcomes[vm]
	if !ok || out.outcome == capacity.OutcomeFailed && out.attempt < o.attempt {
		return mOutcome{}, false
	}
	return out, true
}

func (o *mOp) unfinished() []string {
	out := []string{}
	for _, vm := range o.vms {
		if _, ok := o.final(vm); !ok {
			out = append(out, vm)
		}
	}
	return out
}

// mRecord is an Idempotency-Key's stored answer.
type mRecord struct {
	fingerprint string
	answer      []byte
	expires     time.Time
}

// mCall is a call made with an Idempotency-Key (or as an event), to deliver again.
type mCall struct {
	kind string // "reclaim", "release" or "place"
	p    capacity.Principal
	cap  capacity.CapacityRequest
	pl   capacity.PlacementRequest
	meta capacity.RequestMeta
	topo capacity.TopologyRequest
	fire *mSched // the scheduled reclaim a firing runs
}

type model struct {
	t       *rapid.T
	ctx     context.Context
	svc     *capacity.Service
	store   *dynamo.Store
	wf      *capacitytest.Workflow
	clock   time.Time
	seq     int
	nodes   map[string]*mNode
	res     map[string]*mRes // by node + "/" + id
	vms     map[string]*mVM  // by node + "/" + id, live ones (running or terminating)
	ops     map[string]*mOp  // by id
	records map[string]mRecord
	calls   []mCall
	etags   map[string]string // a dry run's ETag -> the plan it names (the model's key)
	dirty   map[string]bool   // operations a step changed, checked after it
	touched map[string]bool   // nodes a step called on, checked after it
	scheds  map[string]*mSched
	revoked map[string]bool // key ids
	inj     *awsfault.Injector
	stats   *modelStats
	kind    string // the step's kind, for the outcome counts
}

// modelStats counts the steps run, by kind, and their outcomes, over every check of a test.
type modelStats struct {
	mu         sync.Mutex
	ops        map[string]int // steps by kind
	outcomes   map[string]int // "kind -> code" (ok, replayed, or the error code)
	checks     int
	violations int
	mismatches int
	faults     map[awsfault.Fault]int // injected
}

func newModelStats() *modelStats {
	return &modelStats{ops: map[string]int{}, outcomes: map[string]int{}, faults: map[awsfault.Fault]int{}}
}

func (s *modelStats) count(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops[kind]++
}

func (s *modelStats) outcome(o string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes[o]++
}

func (s *modelStats) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.ops {
		n += v
	}
	return n
}

func (s *modelStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	b.WriteString("operations by kind:\n")
	for _, k := range slices.Sorted(maps.Keys(s.ops)) {
		fmt.Fprintf(&b, "  %-34s %7d\n", k, s.ops[k])
	}
	b.WriteString("answers by kind:\n")
	for _, k := range slices.Sorted(maps.Keys(s.outcomes)) {
		fmt.Fprintf(&b, "  %-60s %7d\n", k, s.outcomes[k])
	}
	if len(s.faults) > 0 {
		b.WriteString("AWS faults injected:\n")
		for _, f := range slices.Sorted(maps.Keys(s.faults)) {
			fmt.Fprintf(&b, "  %-34s %7d\n", f, s.faults[f])
		}
	}
	fmt.Fprintf(&b, "invariant violations: %d\nmodel mismatches: %d\n", s.violations, s.mismatches)
	return b.String()
}

// mT0 is where the model's clock starts: years ahead of the wall clock, as the emulator deletes
// items whose TTL (an Idempotency-Key record's expiry) the wall clock has passed, at moments
// of its own, which would make a run depend on when it ran.
var mT0 = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)

func newModel(t *rapid.T, mt *modelTables, stats *modelStats) (*model, func()) {
	store, drop := mt.fresh(t)
	m := &model{
		t: t, ctx: context.Background(), store: store, wf: &capacitytest.Workflow{}, clock: mT0,
		nodes: map[string]*mNode{}, res: map[string]*mRes{}, vms: map[string]*mVM{}, ops: map[string]*mOp{},
		records: map[string]mRecord{}, etags: map[string]string{}, dirty: map[string]bool{}, touched: map[string]bool{}, stats: stats,
		scheds: map[string]*mSched{}, revoked: map[string]bool{},
	}
	m.svc = &capacity.Service{
		Store: store, Workflow: m.wf, Logger: quiet,
		Now:       func() time.Time { return m.clock },
		NewID:     func() string { m.seq++; return fmt.Sprintf("id%05d", m.seq) },
		Scheduler: &fakeScheduler{live: map[string]capacity.ScheduledReclaim{}}, Schedules: store, CreatorKeys: store, Keys: store,
	}
	var keys []capacity.APIKey
	for _, p := range mCreators {
		keys = append(keys, keyOf(p))
	}
	if err := store.Keys().Put(m.ctx, keys...); err != nil {
		t.Fatalf("put keys: %v", err)
	}
	for i, id := range mNodeIDs {
		owner := "own-a"
		if i == 2 {
			owner = "own-b"
		}
		units := []string{"u0", "u1", "u2", "u3"}
		_, err := m.svc.PutNode(m.ctx, mOperator, capacity.NodeRequest{
			NodeID: id, OwnerOrgID: owner, AgentEndpoint: "https://agent." + id + ".example", UnitIDs: units,
		}, capacity.RequestMeta{})
		if err != nil {
			t.Fatalf("put node %s: %v", id, err)
		}
		m.nodes[id] = &mNode{owner: owner, units: units, gen: 1, version: 1, nextU: 4, usedVMs: map[string]bool{}}
		// Each node starts with reservation r0 on u0..u2, in term, with u1 and u2 released.
		r0 := capacity.ReservationRequest{NodeID: id, ID: "r0", StartsAt: mT0.Add(-time.Hour), EndsAt: ptr(mT0.Add(30 * 24 * time.Hour)),
			AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: []string{"mgr"}, ReservedUnitIDs: []string{"u0", "u1", "u2"}}
		if _, err := m.svc.CreateReservation(m.ctx, mOperator, r0, capacity.RequestMeta{}); err != nil {
			t.Fatalf("create r0 on %s: %v", id, err)
		}
		rel := capacity.CapacityRequest{NodeID: id, ReservationID: "r0", UnitIDs: []string{"u1", "u2"}}
		if _, err := m.svc.Release(m.ctx, mOperator, rel, capacity.RequestMeta{}); err != nil {
			t.Fatalf("release r0 on %s: %v", id, err)
		}
		m.res[id+"/r0"] = &mRes{id: "r0", node: id, units: r0.ReservedUnitIDs, released: []string{"u1", "u2"}, allowed: r0.AllowedOrgIDs,
			managing: r0.ManagingOrgIDs, status: capacity.StatusActive, start: r0.StartsAt, end: r0.EndsAt, gen: 1, version: 2}
		m.nodes[id].version = 3
	}
	if len(mt.faults) > 0 {
		// From here on the service's writes meet AWS's faults; the model predicts the same.
		fs, inj := mt.faulted(store, rapid.Int64().Draw(t, "faultSeed"))
		m.svc.Store, m.svc.Schedules, m.svc.CreatorKeys, m.svc.Keys = fs, fs, fs, fs
		m.inj = inj
	}
	return m, drop
}

// step starts a step of the kind.
func (m *model) step(kind string) {
	m.kind = kind
	m.stats.count(kind)
}

func (m *model) newID(prefix string) string {
	m.seq++
	return fmt.Sprintf("%s%05d", prefix, m.seq)
}

// ---- the reference rules ----

// access is the caller's role on a reservation: "manage", "view" or "" (none).
func (m *model) access(p capacity.Principal, r *mRes) string {
	n := m.nodes[r.node]
	switch {
	case p.Operator, p.OrgID == n.owner, slices.Contains(r.managing, p.OrgID):
		return "manage"
	case slices.Contains(r.allowed, p.OrgID):
		return "view"
	}
	return ""
}

// authorize is the check of who may move a reservation's capacity: 404 or 403, else "".
func (m *model) authorize(p capacity.Principal, node, resID string) capacity.Code {
	if !slices.Contains(p.Permissions, capacity.PermCapacity) {
		return capacity.CodeNotFound
	}
	r := m.res[node+"/"+resID]
	if r == nil {
		return capacity.CodeNotFound
	}
	switch m.access(p, r) {
	case "":
		return capacity.CodeNotFound
	case "view":
		return capacity.CodeForbidden
	}
	return ""
}

// drawCaller draws the caller of a step on the node, which it marks touched, and counts the
// step as kind; what names the call, by the caller, for mismatches.
func (m *model) drawCaller(t *rapid.T, node, kind, call string) (p capacity.Principal, what string) {
	m.touched[node] = true
	p = rapid.SampledFrom(mCallers).Draw(t, "caller")
	m.step(kind)
	return p, fmt.Sprintf("%s by %s", call, p.KeyID)
}

// lostOrRefused reports whether a call on the reservation is settled before its own rules:
// lost to a transient fault (nothing to model), or refused for the caller's rights (checked).
func (m *model) lostOrRefused(what string, err error, p capacity.Principal, node, resID string) bool {
	if m.transient(err) {
		return true
	}
	if code := m.authorize(p, node, resID); code != "" {
		m.expectErr(what, err, code, nil)
		return true
	}
	return false
}

func ended(r *mRes, t time.Time) bool  { return r.end != nil && !t.Before(*r.end) }
func inTerm(r *mRes, t time.Time) bool { return !t.Before(r.start) && !ended(r, t) }

// statusAt is what a reader sees: ended and not cancelled reads expired.
func statusAt(r *mRes, t time.Time) capacity.Status {
	if r.status != capacity.StatusCancelled && ended(r, t) {
		return capacity.StatusExpired
	}
	return r.status
}

func (m *model) liveVMs(node string) []*mVM {
	return onNode(m.vms, node, func(vm *mVM) (string, string) { return vm.node, vm.id })
}

func (m *model) reservations(node string) []*mRes {
	return onNode(m.res, node, func(r *mRes) (string, string) { return r.node, r.id })
}

// onNode returns the items of all on the node (of is an item's node and id), by id.
func onNode[T any](all map[string]*T, node string, of func(*T) (node, id string)) []*T {
	var out []*T
	for _, it := range all {
		if n, _ := of(it); n == node {
			out = append(out, it)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		_, a := of(out[i])
		_, b := of(out[j])
		return a < b
	})
	return out
}

func occupiedBy(vms []*mVM, units []string) []string {
	var out []string
	for _, u := range units {
		for _, vm := range vms {
			if slices.Contains(vm.units, u) {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

func meet(a, b []string) bool {
	return slices.ContainsFunc(a, func(x string) bool { return slices.Contains(b, x) })
}

func minus(a, b []string) []string {
	out := []string{}
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// capPlan is the model's decision of a reclaim or release.
type capPlan struct {
	err              capacity.Code
	errUnits         []string
	released         []string
	victims, skipped []string
	changes          bool
	etagKey          string
}

func (m *model) decideCapacity(action string, p capacity.Principal, req capacity.CapacityRequest) capPlan {
	if code := m.authorize(p, req.NodeID, req.ReservationID); code != "" {
		return capPlan{err: code}
	}
	r := m.res[req.NodeID+"/"+req.ReservationID]
	n := m.nodes[req.NodeID]
	switch {
	case r.status != capacity.StatusActive:
		return capPlan{err: capacity.CodeReservationNotActive}
	case !inTerm(r, m.clock):
		return capPlan{err: capacity.CodeOutsideTerm}
	case r.gen != n.gen:
		return capPlan{err: capacity.CodeTopologyChanged}
	}
	if bad := minus(req.UnitIDs, r.units); len(bad) > 0 {
		return capPlan{err: capacity.CodeUnitsNotReserved, errUnits: bad}
	}
	var pl capPlan
	if action == capacity.ActionRelease {
		newly := minus(req.UnitIDs, r.released)
		if busy := occupiedBy(m.liveVMs(req.NodeID), newly); len(busy) > 0 {
			return capPlan{err: capacity.CodeUnitsInUse, errUnits: busy}
		}
		pl.released = sorted(append(slices.Clone(r.released), newly...))
		pl.changes = len(newly) > 0
		return pl
	}
	pl.released = minus(r.released, req.UnitIDs)
	pl.victims, pl.skipped = []string{}, []string{}
	for _, vm := range m.liveVMs(req.NodeID) {
		if vm.state != capacity.VMRunning || !meet(vm.units, req.UnitIDs) {
			continue
		}
		if vm.tier == capacity.TierSpot {
			pl.victims = append(pl.victims, vm.id)
		} else {
			pl.skipped = append(pl.skipped, vm.id)
		}
	}
	pl.changes = len(pl.victims) > 0 || len(pl.released) != len(r.released)
	pl.etagKey = fmt.Sprintf("%s|%s|v%d|g%d|%v|%v|%d|%v|%v", req.NodeID, r.id, r.version, n.gen, sorted(req.UnitIDs),
		sorted(pl.released), req.GraceSeconds, pl.victims, pl.skipped)
	return pl
}

// ifMatches is the model's If-Match: "*", or a dry run's ETag whose plan is the current one.
func (m *model) ifMatches(ifMatch, key string) bool {
	return ifMatch == "*" || m.etags[ifMatch] == key
}

// fingerprint is the model's own identity of a request under an Idempotency-Key.
func fingerprint(kind string, v any) string {
	switch r := v.(type) {
	case capacity.CapacityRequest:
		r.UnitIDs, r.IfMatch, r.IdempotencyKey = sorted(r.UnitIDs), "", ""
		v = r
	case capacity.PlacementRequest:
		r.UnitIDs, r.IdempotencyKey = sorted(r.UnitIDs), ""
		v = r
	}
	b, _ := json.Marshal(v)
	return kind + string(b)
}

func scope(node string, p capacity.Principal, key string) string {
	return node + "|" + p.KeyID + "|" + p.OrgID + "|" + key
}

// replayed looks up a request's stored answer: (answer, true, "") to replay, ("", false,
// code) when the key was used for another request, ("", false, "") when nothing binds it.
func (m *model) replayed(node string, p capacity.Principal, key, fp string) ([]byte, bool, capacity.Code) {
	if key == "" {
		return nil, false, ""
	}
	rec, ok := m.records[scope(node, p, key)]
	if !ok || !m.clock.Before(rec.expires) {
		return nil, false, ""
	}
	if rec.fingerprint != fp {
		return nil, false, capacity.CodeIdempotencyKeyReused
	}
	return rec.answer, true, ""
}

// replay checks the answer to a call that the model says its Idempotency-Key binds: the
// stored answer, replayed, or the refusal of a key used for another request. It reports
// whether the key bound the call.
func (m *model) replay(what, node string, p capacity.Principal, key, fp string, res any, replayed func() bool, err error) (capacity.Code, bool) {
	answer, ok, code := m.replayed(node, p, key, fp)
	switch {
	case code != "":
		m.expectErr(what, err, code, nil)
	case ok:
		code = "replayed"
		if err != nil {
			m.mismatch("%s: answered %v (%s), model replays the stored answer", what, err, capacity.ErrorCode(err))
		}
		got, _ := json.Marshal(res)
		if !replayed() || string(got) != string(answer) {
			m.mismatch("%s: replayed=%v %s, model replays %s", what, replayed(), got, answer)
		}
		m.stats.outcome(m.kind + " -> replayed")
	}
	return code, code != ""
}

func (m *model) remember(node string, p capacity.Principal, key, fp string, answer any) {
	if key == "" {
		return
	}
	b, err := json.Marshal(answer)
	if err != nil {
		m.t.Fatalf("encode answer: %v", err)
	}
	m.records[scope(node, p, key)] = mRecord{fingerprint: fp, answer: b, expires: m.clock.Add(24 * time.Hour)}
}

// ---- comparing answers ----

func (m *model) mismatch(format string, args ...any) {
	m.stats.mu.Lock()
	m.stats.mismatches++
	m.stats.mu.Unlock()
	m.t.Fatalf("model mismatch: "+format, args...)
}

// expectErr checks that err has the code the model predicts (and its unit list, if any).
func (m *model) expectErr(what string, err error, code capacity.Code, units []string) capacity.Code {
	m.stats.outcome(m.kind + " -> " + string(code))
	if err == nil {
		m.mismatch("%s: succeeded, model says %s", what, code)
	}
	if got := capacity.ErrorCode(err); got != code {
		m.mismatch("%s: answered %s (%v), model says %s", what, got, err, code)
	}
	if units != nil {
		var e *capacity.Error
		if !errors.As(err, &e) || !slices.Equal(sorted(e.UnitIDs), sorted(units)) {
			m.mismatch("%s: %s names units %v, model says %v", what, code, e.UnitIDs, units)
		}
	}
	return code
}

// transient reports, under AWS faults, an answer that the faults may leave a call with however
// the model decides (throttled, concurrent_modification): it says nothing was applied, which
// the check after the step verifies against the store, and the model stays as it was.
func (m *model) transient(err error) bool {
	if m.inj == nil {
		return false
	}
	switch code := capacity.ErrorCode(err); code {
	case capacity.CodeThrottled, capacity.CodeConcurrentModification:
		m.stats.outcome(m.kind + " -> " + string(code) + " (under faults)")
		return true
	}
	return false
}

func (m *model) expectOK(what string, err error) {
	m.stats.outcome(m.kind + " -> ok")
	if err != nil {
		m.mismatch("%s: answered %v (%s), model says it succeeds", what, err, capacity.ErrorCode(err))
	}
}

func same(a, b []string) bool { return slices.Equal(sorted(a), sorted(b)) }

// ---- steps ----

// reqUnits draws a non-empty set of distinct unit ids: mostly from pool, sometimes one
// that is not on any node.
func drawUnits(t *rapid.T, pool []string, label string) []string {
	if len(pool) == 0 || chance(t, 5, label+"Stray") {
		pool = append(slices.Clone(pool), "u99")
	}
	n := rapid.IntRange(1, min(3, len(pool))).Draw(t, label+"N")
	perm := rapid.Permutation(pool).Draw(t, label)
	return perm[:n]
}

// chance draws true pct percent of the time (rapid shrinks it to false: towards the common
// case, as rapid draws small numbers more often than large).
func chance(t *rapid.T, pct int, label string) bool {
	return rapid.IntRange(0, 99).Draw(t, label) >= 100-pct
}

func (m *model) drawReservation(t *rapid.T, node string) string {
	rs := m.reservations(node)
	if len(rs) == 0 || chance(t, 5, "noRes") {
		return "r-none"
	}
	// Those that may move capacity now first: rapid draws the first ones most often.
	slices.SortStableFunc(rs, func(a, b *mRes) int {
		return cmpBool(a.status == capacity.StatusActive && inTerm(a, m.clock), b.status == capacity.StatusActive && inTerm(b, m.clock))
	})
	return rapid.SampledFrom(rs).Draw(t, "res").id
}

// cmpBool orders true before false.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// drawKey draws an Idempotency-Key: none, a fresh one, or one used before (a reuse).
func (m *model) drawKey(t *rapid.T) string {
	switch rapid.IntRange(0, 9).Draw(t, "keyKind") {
	case 7, 8:
		return m.newID("key-")
	case 9:
		if len(m.calls) > 0 {
			return rapid.SampledFrom(m.calls).Draw(t, "reusedKey").cap.IdempotencyKey
		}
	}
	return ""
}

func (m *model) stepCapacity(t *rapid.T, action string) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	resID := m.drawReservation(t, node)
	pool := m.nodes[node].units
	if r := m.res[node+"/"+resID]; r != nil && !chance(t, 20, "fromNode") {
		pool = r.units
	}
	req := capacity.CapacityRequest{NodeID: node, ReservationID: resID, UnitIDs: drawUnits(t, pool, "units")}
	req.DryRun = chance(t, 25, "dryRun")
	p := rapid.SampledFrom(mCallers).Draw(t, "caller")
	meta := capacity.RequestMeta{RequestID: m.newID("req-")}
	if action == capacity.ActionReclaim {
		req.GraceSeconds = rapid.SampledFrom([]int{0, 0, 0, 0, 30, 120, capacity.MaxGraceSeconds + 1}).Draw(t, "grace")
		switch rapid.IntRange(0, 9).Draw(t, "ifMatch") {
		case 9:
			req.IfMatch = "*"
		case 6, 7, 8:
			if len(m.etags) > 0 {
				req.IfMatch = rapid.SampledFrom(slices.Sorted(maps.Keys(m.etags))).Draw(t, "etag")
			}
		case 5:
			req.IfMatch = `"0123456789abcdef0123456789abcdef"`
		}
	}
	if chance(t, 15, "viaEvent") && action == capacity.ActionReclaim {
		// A reclaim requested on the bus: it acts as its source, keyed by the event's id.
		p = mSource
		meta.Via, meta.EventID = capacity.ViaEvent, m.newID("ev-")
		req.IdempotencyKey = capacity.EventKeyPrefix + meta.EventID
		req.IfMatch = ""
	} else {
		req.IdempotencyKey = m.drawKey(t)
	}
	call := mCall{kind: action, p: p, cap: req, meta: meta}
	if req.IdempotencyKey != "" {
		m.calls = append(m.calls, call)
	}
	m.step(action + dryLabel(req.DryRun))
	m.capacityCall(call)
}

func dryLabel(dry bool) string {
	if dry {
		return " (dry run)"
	}
	return ""
}

// capacityCall runs a reclaim or release and checks its answer against the model, which it
// then moves on.
func (m *model) capacityCall(c mCall) {
	var res *capacity.CapacityResult
	var err error
	if c.kind == capacity.ActionReclaim {
		res, err = m.svc.Reclaim(m.ctx, c.p, c.cap, c.meta)
	} else {
		res, err = m.svc.Release(m.ctx, c.p, c.cap, c.meta)
	}
	if m.transient(err) {
		return
	}
	m.expectCapacity(c, fmt.Sprintf("%s %+v by %s", c.kind, c.cap, c.p.KeyID), res, err)
}

// expectCapacity checks the answer to a reclaim or release (of a scheduled reclaim's firing
// too) against the model, which it then moves on; it returns what the model predicted: ""
// (applied), "replayed", or the error code.
func (m *model) expectCapacity(c mCall, what string, res *capacity.CapacityResult, err error) capacity.Code {
	req, p := c.cap, c.p
	m.touched[req.NodeID] = true
	if !slices.Contains(p.Permissions, capacity.PermCapacity) {
		return m.expectErr(what, err, capacity.CodeNotFound, nil)
	}
	// A client may not take the keys the service keys events and scheduled firings with.
	ownKey := strings.HasPrefix(req.IdempotencyKey, capacity.EventKeyPrefix) || strings.HasPrefix(req.IdempotencyKey, capacity.ScheduledKeyPrefix)
	ownKey = ownKey && !(c.meta.Via == capacity.ViaEvent && req.IdempotencyKey == capacity.EventKeyPrefix+c.meta.EventID)
	ownKey = ownKey && !(c.meta.Via == capacity.ViaSchedule && strings.HasPrefix(req.IdempotencyKey, capacity.ScheduledKeyPrefix))
	if ownKey || req.GraceSeconds > capacity.MaxGraceSeconds || c.kind == capacity.ActionRelease && req.IfMatch != "" {
		return m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
	}
	if code := m.authorize(p, req.NodeID, req.ReservationID); code != "" {
		return m.expectErr(what, err, code, nil)
	}
	fp := fingerprint(c.kind, req)
	if code, ok := m.replay(what, req.NodeID, p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return code
	}
	pl := m.decideCapacity(c.kind, p, req)
	if pl.err == "" && c.kind == capacity.ActionReclaim && req.IfMatch != "" && !req.DryRun && !m.ifMatches(req.IfMatch, pl.etagKey) {
		pl.err = capacity.CodePlanChanged
	}
	if pl.err == "" && c.fire != nil && c.fire.state != capacity.ScheduledPending {
		pl.err = capacity.CodeScheduledReclaimFired // its record has expired: it fired before
	}
	if pl.err != "" {
		return m.expectErr(what, err, pl.err, pl.errUnits)
	}
	m.expectOK(what, err)
	r := m.res[req.NodeID+"/"+req.ReservationID]
	if !same(res.Reservation.ReleasedUnitIDs, pl.released) && !req.DryRun {
		m.mismatch("%s: released after %v, model %v", what, res.Reservation.ReleasedUnitIDs, pl.released)
	}
	if c.kind == capacity.ActionReclaim {
		if !slices.Equal(sorted(res.Terminated), pl.victims) || !slices.Equal(sorted(res.Skipped), pl.skipped) {
			m.mismatch("%s: terminated %v skipped %v, model %v %v", what, res.Terminated, res.Skipped, pl.victims, pl.skipped)
		}
		evicts := len(pl.victims) > 0 && !req.DryRun
		if (res.ReclaimID != "") != evicts {
			m.mismatch("%s: reclaimId %q, model evicts: %v", what, res.ReclaimID, evicts)
		}
		wantAfter := time.Time{}
		if evicts {
			wantAfter = m.clock.Add(time.Duration(req.GraceSeconds) * time.Second)
		}
		if !res.TerminateAfter.Equal(wantAfter) {
			m.mismatch("%s: terminateAfter %v, model %v", what, res.TerminateAfter, wantAfter)
		}
		if req.DryRun {
			if res.PlanETag == "" {
				m.mismatch("%s: dry run answered no planEtag", what)
			}
			if key, seen := m.etags[res.PlanETag]; seen && key != pl.etagKey {
				m.mismatch("%s: ETag %s names plan %s and %s", what, res.PlanETag, key, pl.etagKey)
			}
			m.etags[res.PlanETag] = pl.etagKey
		}
	}
	if req.DryRun {
		if res.Reservation.Version != r.version || !same(res.Reservation.ReleasedUnitIDs, r.released) {
			m.mismatch("%s: dry run answered the reservation at v%d %v, model v%d %v", what,
				res.Reservation.Version, res.Reservation.ReleasedUnitIDs, r.version, r.released)
		}
		return ""
	}
	if pl.changes {
		r.version++
		m.nodes[req.NodeID].version++
		r.released = pl.released
	}
	if res.Reservation.Version != r.version {
		m.mismatch("%s: reservation version %d, model %d", what, res.Reservation.Version, r.version)
	}
	if len(pl.victims) > 0 {
		op := &mOp{id: res.ReclaimID, node: req.NodeID, res: r.id, vms: pl.victims, state: capacity.OpPendingStart, attempt: 1,
			outcomes: map[string]mOutcome{}}
		if m.ops[op.id] != nil {
			m.mismatch("%s: reclaim id %s reused", what, op.id)
		}
		m.ops[op.id] = op
		m.dirty[op.id] = true
		for _, id := range pl.victims {
			vm := m.vms[req.NodeID+"/"+id]
			vm.state, vm.reclaim = capacity.VMTerminating, op.id
		}
		if last := m.wf.Last(); last != op.id {
			m.mismatch("%s: workflow started %q, want %q", what, last, op.id)
		}
	}
	m.remember(req.NodeID, p, req.IdempotencyKey, fp, res)
	return ""
}

func (m *model) stepPlace(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	vmID := m.newID("vm")
	if used := slices.Sorted(maps.Keys(n.usedVMs)); len(used) > 0 && chance(t, 10, "reuseVM") {
		vmID = rapid.SampledFrom(used).Draw(t, "vmID")
	}
	tier := rapid.SampledFrom([]capacity.Tier{capacity.TierSpot, capacity.TierSpot, capacity.TierReserved, capacity.TierOnDemand}).Draw(t, "tier")
	org := rapid.SampledFrom([]string{"aud", "buyer"}).Draw(t, "org")
	req := capacity.PlacementRequest{NodeID: node, VMID: vmID, OrgID: org, Tier: tier, UnitIDs: drawUnits(t, n.units, "units")}
	p := mPlacer
	if chance(t, 5, "placeNoPerm") {
		p = mOwnerA
	}
	if chance(t, 20, "placeKey") {
		req.IdempotencyKey = m.newID("key-")
		m.calls = append(m.calls, mCall{kind: capacity.ActionPlace, p: p, pl: req})
	}
	m.step("place " + string(tier))
	m.placeCall(p, req)
}

func (m *model) placeCall(p capacity.Principal, req capacity.PlacementRequest) {
	what := fmt.Sprintf("place %+v by %s", req, p.KeyID)
	m.touched[req.NodeID] = true
	res, err := m.svc.Place(m.ctx, p, req, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if !p.Operator || !slices.Contains(p.Permissions, capacity.PermPlace) {
		m.expectErr(what, err, capacity.CodeNotFound, nil)
		return
	}
	fp := fingerprint(capacity.ActionPlace, req)
	if _, ok := m.replay(what, req.NodeID, p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return
	}
	n := m.nodes[req.NodeID]
	live := m.liveVMs(req.NodeID)
	if unknown := minus(req.UnitIDs, n.units); len(unknown) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, unknown)
		return
	}
	if m.vms[req.NodeID+"/"+req.VMID] != nil {
		m.expectErr(what, err, capacity.CodeVMExists, nil)
		return
	}
	if busy := occupiedBy(live, req.UnitIDs); len(busy) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsInUse, busy)
		return
	}
	var unavailable []string
	for _, u := range req.UnitIDs {
		if !m.admits(req.NodeID, u, req.Tier, req.OrgID) {
			unavailable = append(unavailable, u)
		}
	}
	if len(unavailable) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsUnavailable, unavailable)
		return
	}
	if n.usedVMs[req.VMID] { // terminated: its id stays in the node's history
		m.expectErr(what, err, capacity.CodeVMExists, nil)
		return
	}
	m.expectOK(what, err)
	if res.VM.ID != req.VMID || res.VM.Tier != req.Tier || res.VM.State != capacity.VMRunning || !same(res.VM.UnitIDs, req.UnitIDs) {
		m.mismatch("%s: placed %+v", what, res.VM)
	}
	n.usedVMs[req.VMID] = true
	n.version++
	m.vms[req.NodeID+"/"+req.VMID] = &mVM{id: req.VMID, node: req.NodeID, org: req.OrgID, tier: req.Tier,
		units: sorted(req.UnitIDs), state: capacity.VMRunning}
	m.remember(req.NodeID, p, req.IdempotencyKey, fp, res)
}

// admits is the placement rule of docs/api.md for one unit: held by one reservation (active or
// pending in its term; needs-review until it ends), a unit takes a spot VM if released by
// an active reservation in term at the node's generation, a reserved VM of its audience if
// exclusive to one; held by none, spot or on-demand, but only spot while a reservation is
// still to start on it; held by two, nothing.
func (m *model) admits(node, unit string, tier capacity.Tier, org string) bool {
	var holders []*mRes
	upcoming := false
	for _, r := range m.reservations(node) {
		if !slices.Contains(r.units, unit) {
			continue
		}
		switch r.status {
		case capacity.StatusNeedsReview:
			if !ended(r, m.clock) {
				holders = append(holders, r)
			}
		case capacity.StatusActive, capacity.StatusPending:
			if inTerm(r, m.clock) {
				holders = append(holders, r)
			} else if m.clock.Before(r.start) {
				upcoming = true
			}
		}
	}
	switch len(holders) {
	case 0:
		return tier == capacity.TierSpot || tier == capacity.TierOnDemand && !upcoming
	case 1:
	default:
		return false
	}
	r := holders[0]
	grants := r.status == capacity.StatusActive && r.gen == m.nodes[node].gen
	released := slices.Contains(r.released, unit)
	switch tier {
	case capacity.TierSpot:
		return grants && released
	case capacity.TierReserved:
		return grants && !released && slices.Contains(r.allowed, org)
	}
	return false
}

// stepDuplicate delivers a call made under an Idempotency-Key (or an event) again.
func (m *model) stepDuplicate(t *rapid.T) {
	if len(m.calls) == 0 {
		return
	}
	c := rapid.SampledFrom(m.calls).Draw(t, "call")
	m.step("duplicate " + c.kind)
	c.meta.RequestID = m.newID("req-")
	switch c.kind {
	case capacity.ActionPlace:
		m.placeCall(c.p, c.pl)
	case capacity.ActionTopologySet:
		m.topologyCall(c)
	default:
		m.capacityCall(c)
	}
}

// fates of a VM under termination, as its agent answers.
const (
	fateTerminated = "terminated"
	fateGone       = "gone"
	fateTransient  = "transient" // fails, retryably, every round of this run
	fatePermanent  = "permanent" // fails, not retryably
)

// agentOf is the nodes' agents answering as the fates say (by VM).
func agentOf(fates map[string]string) *capacitytest.Agent {
	a := &capacitytest.Agent{FailFirst: map[string]int{}, Permanent: map[string]bool{}, Gone: map[string]bool{}}
	for vm, f := range fates {
		switch f {
		case fateGone:
			a.Gone[vm] = true
		case fateTransient:
			a.FailFirst[vm] = math.MaxInt
		case fatePermanent:
			a.Permanent[vm] = true
		}
	}
	return a
}

// drawOp draws one of the operations, or nil when there is none.
func (m *model) drawOp(t *rapid.T) *mOp {
	ids := slices.Sorted(maps.Keys(m.ops))
	if len(ids) == 0 {
		return nil
	}
	return m.ops[rapid.SampledFrom(ids).Draw(t, "op")]
}

// stepTerminate runs rounds of an operation's termination workflow, each VM's agent
// answering as drawn; it may stop before the workflow is done (the next run goes on).
func (m *model) stepTerminate(t *rapid.T) {
	op := m.drawOp(t)
	if op == nil {
		return
	}
	m.touched[op.node] = true
	fates := map[string]string{}
	for _, vm := range op.vms {
		fates[vm] = rapid.SampledFrom([]string{fateTerminated, fateTerminated, fateGone, fateTransient, fatePermanent}).Draw(t, "fate")
	}
	agent := agentOf(fates)
	term := &capacity.Terminator{Store: m.store, Agent: agent, Now: func() time.Time { return m.clock }, Logger: quiet}
	maxRounds := rapid.IntRange(1, 3).Draw(t, "maxRounds")
	rounds := rapid.IntRange(1, maxRounds).Draw(t, "rounds")
	attempt := op.attempt
	stale := attempt > 1 && chance(t, 20, "stale")
	if stale {
		attempt-- // a late branch of the execution a re-drive replaced
	}
	task := capacity.TerminationTask{ReclaimID: op.id, NodeID: op.node, VMIDs: op.unfinished(), ExecutionARN: "arn:exec:" + op.id,
		Attempt: attempt, MaxRounds: maxRounds}
	m.step(fmt.Sprintf("terminate (%s)", op.state))
	m.dirty[op.id] = true
	for round := range rounds {
		what := fmt.Sprintf("termination of %s round %d (fates %v, attempt %d of %d)", op.id, round, fates, attempt, op.attempt)
		rep, err := term.Run(m.ctx, task)
		m.expectOK(what, err)
		if stale || op.state == capacity.OpCompleted || op.state == capacity.OpFailed {
			if !rep.Done || len(rep.Terminated)+len(rep.AlreadyGone)+len(rep.Failed) > 0 || agent.Total() > 0 {
				m.mismatch("%s: a finished operation or a stale attempt acted: %+v, agent calls %d", what, rep, agent.Total())
			}
			return
		}
		op.state = capacity.OpTerminating
		last := round+1 >= maxRounds
		var next []string
		for _, vm := range task.VMIDs {
			if _, ok := op.final(vm); ok {
				continue
			}
			switch f := fates[vm]; {
			case f == fateTerminated || f == fateGone:
				out := capacity.OutcomeTerminated
				if f == fateGone {
					out = capacity.OutcomeAlreadyGone
				}
				op.outcomes[vm] = mOutcome{outcome: out, attempt: op.attempt}
				m.vms[op.node+"/"+vm].state = capacity.VMTerminated
				delete(m.vms, op.node+"/"+vm)
			case f == fateTransient && !last:
				next = append(next, vm)
			default:
				op.outcomes[vm] = mOutcome{outcome: capacity.OutcomeFailed, attempt: op.attempt}
			}
		}
		if !same(rep.Next.VMIDs, next) || rep.Done != (len(next) == 0) {
			m.mismatch("%s: next %v done %v, model next %v", what, rep.Next.VMIDs, rep.Done, next)
		}
		if len(op.unfinished()) == 0 {
			op.state = capacity.OpCompleted
			for _, out := range op.outcomes {
				if out.outcome == capacity.OutcomeFailed {
					op.state = capacity.OpFailed
				}
			}
		}
		if rep.Done {
			return
		}
		task = rep.Next
	}
}

// stepRedrive re-drives an operation (a new attempt for the VMs that failed).
func (m *model) stepRedrive(t *rapid.T) {
	op := m.drawOp(t)
	if op == nil {
		return
	}
	p, what := m.drawCaller(t, op.node, fmt.Sprintf("redrive (%s)", op.state), fmt.Sprintf("redrive %s (%s)", op.id, op.state))
	res, err := m.svc.Redrive(m.ctx, p, op.node, op.res, op.id, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, op.node, op.res) {
		return
	}
	if op.state == capacity.OpPendingStart || op.state == capacity.OpTerminating {
		m.expectErr(what, err, capacity.CodeOperationRunning, nil)
		return
	}
	m.expectOK(what, err)
	var retry []string
	for _, vm := range op.vms {
		if out := op.outcomes[vm]; out.outcome == capacity.OutcomeFailed {
			retry = append(retry, vm)
		}
	}
	if !same(res.Retried, retry) {
		m.mismatch("%s: retried %v, model %v", what, res.Retried, retry)
	}
	if len(retry) == 0 {
		return
	}
	m.dirty[op.id] = true
	op.attempt++
	op.state = capacity.OpPendingStart
	if last, want := m.wf.Last(), fmt.Sprintf("%s-%d", op.id, op.attempt); last != want {
		m.mismatch("%s: workflow started %q, want %q", what, last, want)
	}
}

// stepCreate creates a reservation.
func (m *model) stepCreate(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	id := rapid.SampledFrom([]string{"r1", "r2", "r3", "r4", "r0"}).Draw(t, "resID")
	start := m.clock.Add(rapid.SampledFrom([]time.Duration{-2 * time.Hour, 0, time.Hour, 26 * time.Hour}).Draw(t, "startIn"))
	var end *time.Time
	if d := rapid.SampledFrom([]time.Duration{0, time.Hour, 25 * time.Hour, 72 * time.Hour}).Draw(t, "term"); d > 0 {
		end = ptr(start.Add(d))
	}
	status := rapid.SampledFrom([]capacity.Status{capacity.StatusActive, capacity.StatusActive, capacity.StatusPending}).Draw(t, "status")
	managing := []string{"mgr"}
	if chance(t, 25, "noManager") {
		managing = nil
	}
	req := capacity.ReservationRequest{NodeID: node, ID: id, Status: status, StartsAt: start, EndsAt: end,
		AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: managing, ReservedUnitIDs: drawUnits(t, n.units, "units")}
	m.step("create reservation")
	what := fmt.Sprintf("create %+v", req)
	res, err := m.svc.CreateReservation(m.ctx, mOperator, req, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if end != nil && !end.After(m.clock) {
		m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
		return
	}
	if m.res[node+"/"+id] != nil {
		m.expectErr(what, err, capacity.CodeReservationExists, nil)
		return
	}
	if unknown := minus(req.ReservedUnitIDs, n.units); len(unknown) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, unknown)
		return
	}
	nr := &mRes{id: id, node: node, units: req.ReservedUnitIDs, allowed: []string{"aud"}, managing: managing,
		status: status, start: start, end: end, gen: n.gen, version: 1}
	var overlap []string
	for _, o := range m.reservations(node) {
		s := statusAt(o, m.clock)
		claims := s == capacity.StatusActive || s == capacity.StatusPending || s == capacity.StatusNeedsReview
		termsMeet := (o.end == nil || nr.start.Before(*o.end)) && (nr.end == nil || o.start.Before(*nr.end))
		if claims && termsMeet {
			for _, u := range nr.units {
				if slices.Contains(o.units, u) && !slices.Contains(overlap, u) {
					overlap = append(overlap, u)
				}
			}
		}
	}
	if len(overlap) > 0 {
		m.expectErr(what, err, capacity.CodeReservationOverlap, overlap)
		return
	}
	var inUse []string
	released := []string{}
	for _, vm := range m.liveVMs(node) {
		for _, u := range vm.units {
			switch {
			case !slices.Contains(nr.units, u):
			case vm.tier == capacity.TierSpot:
				released = append(released, u)
			default:
				inUse = append(inUse, u)
			}
		}
	}
	if len(inUse) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsInUse, inUse)
		return
	}
	m.expectOK(what, err)
	nr.released = sorted(released)
	if !same(res.Reservation.ReleasedUnitIDs, nr.released) || res.Reservation.Status != status {
		m.mismatch("%s: created %+v, model released %v", what, res.Reservation, nr.released)
	}
	m.res[node+"/"+id] = nr
	n.version++
}

// drawExisting draws a reservation of any node, those in status first.
func (m *model) drawExisting(t *rapid.T, status capacity.Status) *mRes {
	keys := slices.Sorted(maps.Keys(m.res))
	if len(keys) == 0 {
		return nil
	}
	slices.SortStableFunc(keys, func(a, b string) int {
		return cmpBool(statusAt(m.res[a], m.clock) == status, statusAt(m.res[b], m.clock) == status)
	})
	return m.res[rapid.SampledFrom(keys).Draw(t, "res")]
}

// stepCancel cancels a reservation.
func (m *model) stepCancel(t *rapid.T) {
	r := m.drawExisting(t, capacity.StatusPending)
	if r == nil {
		return
	}
	m.touched[r.node] = true
	m.step("cancel")
	what := fmt.Sprintf("cancel %s/%s (%s)", r.node, r.id, statusAt(r, m.clock))
	res, err := m.svc.CancelReservation(m.ctx, mOperator, capacity.ReservationChange{NodeID: r.node, ReservationID: r.id}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	switch statusAt(r, m.clock) {
	case capacity.StatusExpired:
		m.expectErr(what, err, capacity.CodeInvalidTransition, nil)
		return
	case capacity.StatusCancelled:
		m.expectOK(what, err)
	default:
		m.expectOK(what, err)
		r.status = capacity.StatusCancelled
		r.version++
		m.nodes[r.node].version++
	}
	var on []string
	for _, vm := range m.liveVMs(r.node) {
		if meet(vm.units, r.units) {
			on = append(on, vm.id)
		}
	}
	if got := capacity.VMIDs(res.VMsOnUnits); !same(got, on) || res.Reservation.Status != capacity.StatusCancelled {
		m.mismatch("%s: answered %s with VMs %v, model VMs %v", what, res.Reservation.Status, got, on)
	}
	for _, sc := range m.scheds {
		if sc.node == r.node && sc.res == r.id && sc.state == capacity.ScheduledPending {
			sc.state, sc.code, sc.loose = capacity.ScheduledCancelled, capacity.CodeReservationNotActive, m.inj != nil
		}
	}
}

// stepReaffirm reaffirms a reservation.
func (m *model) stepReaffirm(t *rapid.T) {
	r := m.drawExisting(t, capacity.StatusNeedsReview)
	if r == nil {
		return
	}
	m.touched[r.node] = true
	m.step("reaffirm")
	n := m.nodes[r.node]
	what := fmt.Sprintf("reaffirm %s/%s (%s)", r.node, r.id, statusAt(r, m.clock))
	res, err := m.svc.ReaffirmReservation(m.ctx, mOperator, capacity.ReservationChange{NodeID: r.node, ReservationID: r.id}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if statusAt(r, m.clock) != capacity.StatusNeedsReview {
		m.expectErr(what, err, capacity.CodeInvalidTransition, nil)
		return
	}
	if gone := minus(r.units, n.units); len(gone) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, gone)
		return
	}
	m.expectOK(what, err)
	r.status, r.gen = capacity.StatusActive, n.gen
	r.released = sorted(minus(r.released, minus(r.released, n.units)))
	r.version++
	n.version++
	if !same(res.Reservation.ReleasedUnitIDs, r.released) || res.Reservation.TopologyGen != n.gen {
		m.mismatch("%s: answered %+v, model released %v gen %d", what, res.Reservation, r.released, n.gen)
	}
}

// stepTopology changes a node's unit list (or sends it as it is), sometimes against a
// generation that is no longer the node's.
func (m *model) stepTopology(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	units := slices.Clone(n.units)
	if len(units) > 1 && chance(t, 50, "remove") {
		i := rapid.IntRange(0, len(units)-1).Draw(t, "removeAt")
		units = slices.Delete(units, i, i+1)
	}
	if chance(t, 50, "add") {
		units = append(units, fmt.Sprintf("u%d", n.nextU))
	}
	req := capacity.TopologyRequest{NodeID: node, UnitIDs: units}
	switch rapid.IntRange(0, 9).Draw(t, "expectedGen") {
	case 7, 8:
		req.ExpectedTopologyGen = ptr(n.gen)
	case 9:
		if n.gen > 1 {
			req.ExpectedTopologyGen = ptr(n.gen - 1)
		}
	}
	m.step("topology")
	c := mCall{kind: capacity.ActionTopologySet, p: mOperator, topo: req, meta: capacity.RequestMeta{RequestID: m.newID("req-")}}
	if chance(t, 25, "topologyEvent") {
		// A Node Topology Changed event from the fleet: keyed by its event id.
		c.p, c.meta.Via, c.meta.EventID = mFleet, capacity.ViaEvent, m.newID("ev-")
		c.topo.IdempotencyKey = capacity.EventKeyPrefix + c.meta.EventID
		m.calls = append(m.calls, c)
	}
	m.topologyCall(c)
}

// topologyCall runs a topology change and checks its answer against the model, which it
// then moves on.
func (m *model) topologyCall(c mCall) {
	req, n, node := c.topo, m.nodes[c.topo.NodeID], c.topo.NodeID
	m.touched[node] = true
	units := req.UnitIDs
	what := fmt.Sprintf("topology %+v by %s (node at gen %d, units %v)", req, c.p.KeyID, n.gen, n.units)
	res, err := m.svc.SetTopology(m.ctx, c.p, req, c.meta)
	if m.transient(err) {
		return
	}
	fp := fingerprint(c.kind, req)
	if _, ok := m.replay(what, node, c.p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return
	}
	if req.ExpectedTopologyGen != nil && *req.ExpectedTopologyGen != n.gen {
		m.expectErr(what, err, capacity.CodeTopologyChanged, nil)
		return
	}
	m.expectOK(what, err)
	defer m.remember(node, c.p, req.IdempotencyKey, fp, res)
	changed := !same(units, n.units)
	if res.Changed != changed {
		m.mismatch("%s: changed %v, model %v", what, res.Changed, changed)
	}
	if !changed {
		return
	}
	if slices.Contains(units, fmt.Sprintf("u%d", n.nextU)) {
		n.nextU++
	}
	n.units, n.gen = units, n.gen+1
	n.version++
	var review []string
	for _, r := range m.reservations(node) {
		if statusAt(r, m.clock) == capacity.StatusActive {
			r.status = capacity.StatusNeedsReview
			r.version++
			review = append(review, r.id)
		}
	}
	if !same(res.NeedsReview, review) || res.Node.TopologyGen != n.gen {
		m.mismatch("%s: needs review %v at gen %d, model %v at %d", what, res.NeedsReview, res.Node.TopologyGen, review, n.gen)
	}
}

// stepClock lets time pass: reservations start and end.
func (m *model) stepClock(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 25 * time.Hour}).Draw(t, "advance")
	m.step("clock")
	for _, id := range mNodeIDs {
		m.touched[id] = true // every node's invariants hold at the new time
	}
	m.clock = m.clock.Add(d)
}

// stepSchedule schedules a reclaim.
func (m *model) stepSchedule(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	resID := m.drawReservation(t, node)
	pool := m.nodes[node].units
	if r := m.res[node+"/"+resID]; r != nil {
		pool = r.units
	}
	p := rapid.SampledFrom(mCreators).Draw(t, "creator")
	req := capacity.CapacityRequest{NodeID: node, ReservationID: resID, UnitIDs: drawUnits(t, pool, "units"),
		GraceSeconds: rapid.SampledFrom([]int{0, 30}).Draw(t, "grace")}
	at := m.clock.Add(rapid.SampledFrom([]time.Duration{10 * time.Minute, time.Hour, 26 * time.Hour, 0}).Draw(t, "at"))
	m.step("schedule")
	what := fmt.Sprintf("schedule %+v at %v by %s", req, at, p.KeyID)
	res, err := m.svc.ScheduleReclaim(m.ctx, p, req, at, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, node, resID) {
		return
	}
	if pl := m.decideCapacity(capacity.ActionReclaim, p, req); pl.err != "" {
		m.expectErr(what, err, pl.err, pl.errUnits)
		return
	}
	if r := m.res[node+"/"+resID]; !at.After(m.clock) || !inTerm(r, at) {
		m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
		return
	}
	m.expectOK(what, err)
	sr := res.Scheduled
	if sr.State != capacity.ScheduledPending || !sr.At.Equal(at) || !same(sr.UnitIDs, req.UnitIDs) || m.scheds[sr.ID] != nil {
		m.mismatch("%s: scheduled %+v", what, sr)
	}
	m.scheds[sr.ID] = &mSched{id: sr.ID, node: node, res: resID, units: sorted(req.UnitIDs), grace: req.GraceSeconds, at: at,
		creator: p, state: capacity.ScheduledPending}
}

func (m *model) drawScheduled(t *rapid.T) *mSched {
	ids := slices.Sorted(maps.Keys(m.scheds))
	if len(ids) == 0 {
		return nil
	}
	// Pending ones first: rapid draws the first ones most often.
	slices.SortStableFunc(ids, func(a, b string) int {
		return cmpBool(m.scheds[a].state == capacity.ScheduledPending, m.scheds[b].state == capacity.ScheduledPending)
	})
	return m.scheds[rapid.SampledFrom(ids).Draw(t, "scheduled")]
}

// stepFire fires a scheduled reclaim, mostly once its time has come (the clock moves on to
// it), sometimes early, and again (Scheduler may deliver a firing twice).
func (m *model) stepFire(t *rapid.T) {
	sc := m.drawScheduled(t)
	if sc == nil {
		return
	}
	if m.clock.Before(sc.at) && !chance(t, 20, "early") {
		m.clock = sc.at
		for _, id := range mNodeIDs {
			m.touched[id] = true
		}
	}
	m.touched[sc.node] = true
	m.step(fmt.Sprintf("fire (%s)", sc.state))
	meta := capacity.RequestMeta{RequestID: m.newID("req-"), Via: capacity.ViaSchedule, EventID: m.newID("ev-")}
	what := fmt.Sprintf("fire %s (%s, at %v, now %v, creator %s)", sc.id, sc.state, sc.at, m.clock, sc.creator.KeyID)
	res, err := m.svc.FireScheduledReclaim(m.ctx, sc.node, sc.res, sc.id, meta)
	if m.transient(err) {
		return
	}
	switch sc.state {
	case capacity.ScheduledCancelled:
		m.expectErr(what, err, capacity.CodeScheduledReclaimCancelled, nil)
		return
	case capacity.ScheduledRefused:
		m.expectErr(what, err, sc.code, nil)
		return
	case capacity.ScheduledPending:
		if m.clock.Before(sc.at.Add(-capacity.FiringSkew)) {
			m.expectErr(what, err, capacity.CodeScheduledReclaimNotDue, nil)
			return
		}
		if m.revoked[sc.creator.KeyID] {
			sc.state, sc.code = capacity.ScheduledRefused, m.expectErr(what, err, capacity.CodeCreatorKeyInvalid, nil)
			sc.loose = m.inj != nil
			return
		}
	}
	creator := capacity.Principal{KeyID: sc.creator.KeyID, OrgID: sc.creator.OrgID, Operator: sc.creator.Operator,
		Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: sc.node, ReservationID: sc.res, UnitIDs: sc.units, GraceSeconds: sc.grace,
		IdempotencyKey: capacity.FireIdempotencyKey(sc.id)}
	code := m.expectCapacity(mCall{kind: capacity.ActionReclaim, p: creator, cap: req, meta: meta, fire: sc}, what, res, err)
	if sc.state != capacity.ScheduledPending {
		return
	}
	switch code {
	case "":
		sc.state, sc.reclaimID = capacity.ScheduledCompleted, res.ReclaimID
	case "replayed":
		m.mismatch("%s: a pending scheduled reclaim replayed an answer", what)
	default:
		sc.state, sc.code, sc.loose = capacity.ScheduledRefused, code, m.inj != nil
	}
}

// stepUnschedule cancels a scheduled reclaim.
func (m *model) stepUnschedule(t *rapid.T) {
	sc := m.drawScheduled(t)
	if sc == nil {
		return
	}
	p, what := m.drawCaller(t, sc.node, fmt.Sprintf("cancel scheduled (%s)", sc.state), fmt.Sprintf("cancel scheduled %s (%s)", sc.id, sc.state))
	res, err := m.svc.CancelScheduledReclaim(m.ctx, p, sc.node, sc.res, sc.id, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, sc.node, sc.res) {
		return
	}
	switch sc.state {
	case capacity.ScheduledCompleted, capacity.ScheduledRefused:
		m.expectErr(what, err, capacity.CodeScheduledReclaimFired, nil)
		return
	case capacity.ScheduledPending:
		sc.state = capacity.ScheduledCancelled
	}
	m.expectOK(what, err)
	if res.State != capacity.ScheduledCancelled {
		m.mismatch("%s: answered %s", what, res.State)
	}
}

// stepRevoke revokes the key of a creator of scheduled reclaims.
func (m *model) stepRevoke(t *rapid.T) {
	if !chance(t, 25, "revoke") {
		return // rarely: a revoked key's scheduled reclaims are refused from then on
	}
	p := rapid.SampledFrom(mCreators).Draw(t, "key")
	m.step("revoke key")
	k, err := m.svc.RevokeKey(m.ctx, mOperator, capacity.KeyRevocation{KeyID: p.KeyID}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	m.expectOK("revoke "+p.KeyID, err)
	if !k.Revoked {
		m.mismatch("revoke %s: answered a key not revoked", p.KeyID)
	}
	m.revoked[p.KeyID] = true
}

// ---- after every step ----

func (m *model) violation(format string, args ...any) {
	m.stats.mu.Lock()
	m.stats.violations++
	m.stats.mu.Unlock()
	m.t.Fatalf("invariant violated: "+format, args...)
}

// check holds after every step: every invariant, and the store holds what the model holds,
// on every node the step called on (all of them when time passed, and before the first step):
// the others have not changed since their last check, nor has the time.
func (m *model) check(t *rapid.T) {
	if m.kind == "" {
		for _, id := range mNodeIDs {
			m.touched[id] = true
		}
	}
	for _, id := range slices.Sorted(maps.Keys(m.touched)) {
		st, err := m.store.LoadNode(m.ctx, id, "")
		if err != nil {
			t.Fatalf("load node %s: %v", id, err)
		}
		if v := capacity.Violations(st, m.clock); len(v) > 0 {
			m.violation("node %s at %v: %v\nreservations %+v\nVMs %+v", id, m.clock, v, st.Reservations, st.VMs)
		}
		if v := capacity.OverlapViolations(st, m.clock); len(v) > 0 {
			m.violation("node %s: %v", id, v)
		}
		m.compareNode(id, st)
	}
	for id := range m.dirty {
		op := m.ops[id]
		got, err := m.store.GetOperation(m.ctx, op.node, id)
		if err != nil {
			t.Fatalf("get operation %s: %v", id, err)
		}
		if got.State != op.state || got.CurrentAttempt() != op.attempt || !slices.Equal(got.VMIDs, op.vms) {
			m.mismatch("operation %s is %s at attempt %d for %v, model %s at %d for %v", id, got.State, got.CurrentAttempt(), got.VMIDs,
				op.state, op.attempt, op.vms)
		}
		if len(got.Outcomes) != len(op.outcomes) {
			m.mismatch("operation %s has outcomes %v, model %v", id, got.Outcomes, op.outcomes)
		}
		for vm, out := range op.outcomes {
			if g := got.Outcomes[vm]; g.Outcome != out.outcome || max(1, g.Attempt) != out.attempt {
				m.mismatch("operation %s VM %s outcome %s at %d, model %s at %d", id, vm, g.Outcome, g.Attempt, out.outcome, out.attempt)
			}
		}
	}
	for _, sc := range m.scheds {
		if !m.touched[sc.node] {
			continue
		}
		got, err := m.store.GetScheduled(m.ctx, sc.node, sc.id)
		if err != nil {
			t.Fatalf("get scheduled reclaim %s: %v", sc.id, err)
		}
		if sc.loose && got.State == capacity.ScheduledPending {
			sc.state, sc.code = capacity.ScheduledPending, "" // the best-effort write did not land
			m.stats.outcome("scheduled reclaim's refusal or cancel not recorded (under faults)")
		}
		sc.loose = false
		if got.State != sc.state || got.ReclaimID != sc.reclaimID || sc.state == capacity.ScheduledRefused && got.Code != sc.code {
			m.mismatch("scheduled reclaim %s is %s (%s) reclaim %q, model %s (%s) %q", sc.id, got.State, got.Code, got.ReclaimID,
				sc.state, sc.code, sc.reclaimID)
		}
	}
	clear(m.dirty)
	clear(m.touched)
}

func (m *model) compareNode(id string, st *capacity.NodeState) {
	n := m.nodes[id]
	if !same(st.Node.UnitIDs, n.units) || st.Node.TopologyGen != n.gen || st.Node.Version != n.version {
		m.mismatch("node %s: units %v gen %d version %d, model %v %d %d", id, st.Node.UnitIDs, st.Node.TopologyGen, st.Node.Version,
			n.units, n.gen, n.version)
	}
	want := m.reservations(id)
	if len(st.Reservations) != len(want) {
		m.mismatch("node %s: %d reservations, model %d", id, len(st.Reservations), len(want))
	}
	for _, r := range want {
		got := st.Reservation(r.id)
		if got == nil {
			m.mismatch("node %s: reservation %s missing", id, r.id)
		}
		if got.Status != r.status || !same(got.ReleasedUnitIDs, r.released) || !same(got.ReservedUnitIDs, r.units) ||
			got.TopologyGen != r.gen || got.Version != r.version {
			m.mismatch("reservation %s/%s: %s released %v gen %d v%d, model %s %v %d v%d", id, r.id, got.Status, got.ReleasedUnitIDs,
				got.TopologyGen, got.Version, r.status, r.released, r.gen, r.version)
		}
	}
	vms := m.liveVMs(id)
	if len(st.VMs) != len(vms) {
		m.mismatch("node %s: VMs %v, model %d live", id, capacity.VMIDs(st.VMs), len(vms))
	}
	for _, vm := range vms {
		i := slices.IndexFunc(st.VMs, func(v capacity.VM) bool { return v.ID == vm.id })
		if i < 0 {
			m.mismatch("node %s: VM %s missing", id, vm.id)
		}
		got := st.VMs[i]
		if got.State != vm.state || got.ReclaimID != vm.reclaim || got.Tier != vm.tier || !same(got.UnitIDs, vm.units) {
			m.mismatch("VM %s: %+v, model %+v", vm.id, got, *vm)
		}
	}
}

// verifyChains checks, at the end of a sequence, that both audit chains of every node verify.
func (m *model) verifyChains(t *rapid.T) {
	for _, id := range mNodeIDs {
		for _, chain := range capacity.NodeChains {
			var recs []capacity.AuditRecord
			var head capacity.AuditHead
			page := capacity.PageRequest{Limit: capacity.MaxPageLimit}
			for i := 0; ; i++ {
				p, err := m.svc.ListNodeAudit(m.ctx, mOperator, id, chain, page)
				if err != nil {
					t.Fatalf("list %s chain of %s: %v", chain, id, err)
				}
				if i == 0 {
					head = p.Head
				}
				recs = append(recs, p.Records...)
				if p.NextCursor == "" {
					break
				}
				page.Cursor = p.NextCursor
			}
			if rep := capacity.VerifyAuditChain(head, recs); !rep.OK {
				m.violation("node %s %s chain does not verify: %+v", id, chain, rep)
			}
		}
	}
}

func (m *model) actions() map[string]func(*rapid.T) {
	// Repeated names weigh the steps, and rapid, which draws small numbers more often, draws
	// the names that sort first more often: capacity moves and placements most, the
	// operator's lifecycle calls least.
	reclaim := func(t *rapid.T) { m.stepCapacity(t, capacity.ActionReclaim) }
	release := func(t *rapid.T) { m.stepCapacity(t, capacity.ActionRelease) }
	return map[string]func(*rapid.T){
		"00 reclaim":    reclaim,
		"01 place":      m.stepPlace,
		"02 reclaim":    reclaim,
		"03 release":    release,
		"04 terminate":  m.stepTerminate,
		"05 place":      m.stepPlace,
		"06 create":     m.stepCreate,
		"07 duplicate":  m.stepDuplicate,
		"08 clock":      m.stepClock,
		"09 redrive":    m.stepRedrive,
		"10 terminate":  m.stepTerminate,
		"11 reclaim":    reclaim,
		"12 release":    release,
		"13 cancel":     m.stepCancel,
		"14 topology":   m.stepTopology,
		"15 reaffirm":   m.stepReaffirm,
		"16 create":     m.stepCreate,
		"17 clock":      m.stepClock,
		"18 schedule":   m.stepSchedule,
		"19 fire":       m.stepFire,
		"20 unschedule": m.stepUnschedule,
		"21 revoke":     m.stepRevoke,
		"22 fire":       m.stepFire,
		"":              m.check,
	}
}

// runModel runs rapid checks of the model on one emulator.
func runModel(t *testing.T, mt *modelTables, stats *modelStats) {
	rapid.Check(t, func(rt *rapid.T) {
		m, drop := newModel(rt, mt, stats)
		defer drop()
		rt.Repeat(m.actions())
		m.verifyChains(rt)
		stats.mu.Lock()
		stats.checks++
		if m.inj != nil {
			for f, n := range m.inj.Counts() {
				stats.faults[f] += n
			}
		}
		stats.mu.Unlock()
	})
}

// rapidFlagSet reports whether the run sets a rapid flag (on the command line or through
// rapid's RAPID_* environment variables).
func rapidFlagSet(name string) bool {
	set := os.Getenv("RAPID_"+strings.ToUpper(name)) != ""
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid."+name })
	return set
}

// TestModel is the short run of `make test`: unless -rapid.checks or -rapid.steps say
// otherwise, 10 sequences of about 30 steps (seconds).
func TestModel(t *testing.T) {
	if !rapidFlagSet("checks") {
		setFlag(t, "rapid.checks", "10")
	}
	stats := newModelStats()
	start := time.Now()
	runModel(t, &modelTables{env: dynamotest.New(t)}, stats)
	t.Logf("%d sequences, %d operations in %v\n%s", stats.checks, stats.total(), time.Since(start).Round(time.Millisecond), stats)
}

// TestModelUnderFaults is TestModel with AWS's faults injected into the service's
// transactions (modelFaults): every answer and every state is still the model's.
func TestModelUnderFaults(t *testing.T) {
	if !rapidFlagSet("checks") {
		setFlag(t, "rapid.checks", "10")
	}
	stats := newModelStats()
	start := time.Now()
	runModel(t, &modelTables{env: dynamotest.New(t), faults: modelFaults}, stats)
	t.Logf("%d sequences, %d operations in %v\n%s", stats.checks, stats.total(), time.Since(start).Round(time.Millisecond), stats)
}

func setFlag(t *testing.T, name, value string) {
	t.Helper()
	old := flag.Lookup(name).Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}

// TestModelSoak is the long run of `make soak`: sequences of about 100 steps (-rapid.steps)
// until MODEL_OPS operations have run (or MODEL_TIME, default 15m, has passed: the run is
// bounded), in MODEL_WORKERS (default 2) loops side by side, each on tables of its own, under
// AWS faults (modelFaults) if MODEL_FAULTS is set; then it prints the figures. Skipped unless
// MODEL_OPS is set.
func TestModelSoak(t *testing.T) {
	target, err := strconv.Atoi(os.Getenv("MODEL_OPS"))
	if err != nil || target <= 0 {
		t.Skip("MODEL_OPS (operations to run) not set: the soak runs under make soak")
	}
	bound := 15 * time.Minute
	if v := os.Getenv("MODEL_TIME"); v != "" {
		if bound, err = time.ParseDuration(v); err != nil {
			t.Fatalf("MODEL_TIME: %v", err)
		}
	}
	if !rapidFlagSet("steps") {
		setFlag(t, "rapid.steps", "100")
	}
	if !rapidFlagSet("checks") {
		setFlag(t, "rapid.checks", "20")
	}
	workers := 2 // the machine's two cores; the emulator serves both
	if v := os.Getenv("MODEL_WORKERS"); v != "" {
		if workers, err = strconv.Atoi(v); err != nil || workers < 1 {
			t.Fatalf("MODEL_WORKERS: %q", v)
		}
	}
	stats := newModelStats()
	mt := &modelTables{env: dynamotest.New(t)}
	label := "model soak"
	if os.Getenv("MODEL_FAULTS") != "" {
		mt.faults, label = modelFaults, "model soak under faults"
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for stats.total() < target && time.Since(start) < bound && !t.Failed() {
				runModel(t, mt, stats)
				ops := stats.total()
				fmt.Printf("%s: %d sequences, %d of %d operations, %v, %.0f ops/s\n", label, stats.checks, ops, target,
					time.Since(start).Round(time.Second), float64(ops)/time.Since(start).Seconds())
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	ops := stats.total()
	fmt.Printf("%s: %d operations in %d sequences, elapsed %v, %.0f ops/s\n%s", label, ops, stats.checks,
		elapsed.Round(time.Second), float64(ops)/elapsed.Seconds(), stats)
	if ops < target && !t.Failed() {
		t.Errorf("only %d of %d operations within %v (MODEL_TIME)", ops, target, bound)
	}
}
