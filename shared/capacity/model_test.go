package capacity_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
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
	// the agent key: its generation, sealed, and the previous generation's
	agentGen           int64
	sealed, prevSealed []byte
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
	killed  map[string]bool // VMs (node + "/" + id) an agent terminated or an operator force-ended
	keys    *mKeys          // keys minted in the run, and the api's key cache
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
		scheds: map[string]*mSched{}, revoked: map[string]bool{}, killed: map[string]bool{},
	}
	m.svc = &capacity.Service{
		Store: store, Workflow: m.wf, Logger: quiet,
		Now:       func() time.Time { return m.clock },
		NewID:     func() string { m.seq++; return fmt.Sprintf("id%05d", m.seq) },
		Scheduler: &fakeScheduler{live: map[string]capacity.ScheduledReclaim{}}, Schedules: store, CreatorKeys: store, Keys: store,
		AgentKeySealer: &testSealer{},
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
		st, err := store.LoadNode(m.ctx, id, "")
		if err != nil {
			t.Fatalf("load node %s: %v", id, err)
		}
		m.nodes[id].agentGen, m.nodes[id].sealed = st.Node.AgentKeyGen, st.Node.AgentKey
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
	m.compareAgentKey(id, st.Node)
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
		"23 reconcile":  m.stepReconcile,
		"24 force-end":  m.stepForceEnd,
		"25 mint key":   m.stepMintKey,
		"26 use key":    m.stepUseKey,
		"27 reconcile":  m.stepReconcile,
		"28 revoke key": m.stepRevokeMinted,
		"29 rotate":     m.stepRotate,
		"30 use key":    m.stepUseKey,
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
