package capacity_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
	"github.com/openrelay/capacity/shared/costunits"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/table"
)

// costUnits, when set, is where BenchmarkReclaimUnits writes what a typical reclaim's
// DynamoDB calls read and wrote, call by call, at grace 0 and 120 s: the input of the cost
// table of docs/cost.md, which infra/cost_test.go prices against the synthesised template.
var costUnits = flag.String("cost-units", "", "write the typical reclaims' DynamoDB calls as JSON to this file (docs/cost/units.json)")

// BenchmarkReclaimUnits reports the DynamoDB on-demand read and write units one reclaim
// costs, from the sizes of the items each call reads and writes (the emulator reports no
// consumed capacity): the API call (the key's rate limiter, the decision Query, the
// transaction), then every task of the termination workflow as a run that ends in one
// round goes through them (NotifyAgents, Notify, TerminateNode, Report), with an agent that
// terminates every VM at once. Run with -v for the cost of each call and the size of each
// item written; -cost-units writes the typical cases' calls for the cost table (docs/cost.md):
//
//	go test -run '^$' -bench ReclaimUnits -benchtime 1x ./shared/capacity -args -cost-units "$PWD/docs/cost/units.json"
func BenchmarkReclaimUnits(b *testing.B) {
	out := costunits.File{
		Command: `go test -count=1 -run '^$' -bench ReclaimUnits -benchtime 1x ./shared/capacity -args -cost-units "$PWD/docs/cost/units.json"`,
		Cases:   map[string]costunits.Case{},
	}
	for _, tc := range []struct {
		name    string
		victims int
		grace   int
		key     string // Idempotency-Key
		typical bool   // written to -cost-units
	}{
		{"typical/2-victims", 2, 0, "", true},
		{"typical/2-victims/grace-120s", 2, 120, "", true},
		{"typical/2-victims/idempotency-key", 2, 0, "k-0123456789abcdef", false},
		{"largest/64-victims/idempotency-key", 64, 0, "k-0123456789abcdef", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var r meteredReclaim
			for b.Loop() {
				r = meterReclaim(b, tc.victims, tc.grace, tc.key)
			}
			api, wf := r.units("api"), r.units(workflowSteps...)
			b.ReportMetric(api.rru, "api-RRU")
			b.ReportMetric(api.wru, "api-WRU")
			b.ReportMetric(wf.rru, "workflow-RRU")
			b.ReportMetric(wf.wru, "workflow-WRU")
			b.ReportMetric(0, "ns/op") // the figures are the units, not the emulator's time
			var log strings.Builder
			for _, step := range append([]string{"api"}, workflowSteps...) {
				fmt.Fprintf(&log, "%s:\n%s\n", step, r.units(step))
			}
			b.Logf("\n%s", log.String())
			if tc.typical {
				out.Cases[fmt.Sprintf("grace-%d", tc.grace)] = r.costCase(tc.victims, tc.grace)
			}
		})
	}
	if *costUnits != "" && len(out.Cases) == 2 {
		if err := os.WriteFile(*costUnits, out.Marshal(), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// workflowSteps are the termination workflow's tasks a run that ends in one round goes
// through, in order, as the bench runs them.
var workflowSteps = []string{"NotifyAgents", "Notify", "TerminateNode", "Report"}

// meteredReclaim is what one reclaim's steps did.
type meteredReclaim struct {
	steps  map[string]*meterStep
	stored []costunits.Item
	left   map[string][]map[string]types.AttributeValue // the items it left, by table
	env    *dynamotest.Env
	id     string // the reclaim's
}

type meterStep struct {
	units units
	cost  costunits.Step
}

func (r meteredReclaim) units(steps ...string) units {
	var u units
	for _, s := range steps {
		if st := r.steps[s]; st != nil {
			u.rru += st.units.rru
			u.wru += st.units.wru
			u.lines = st.units.lines
			u.order = st.units.order
		}
	}
	if len(steps) > 1 {
		u.lines, u.order = nil, nil
	}
	return u
}

func (r meteredReclaim) costCase(victims, grace int) costunits.Case {
	c := costunits.Case{Victims: victims, GraceSeconds: grace, Steps: map[string]costunits.Step{}, Stored: r.stored}
	for name, st := range r.steps {
		c.Steps[name] = st.cost
	}
	return c
}

// meterReclaim seeds a node whose reservation has released units under n spot VMs (one unit
// each, plus a reserved and an on-demand VM as the demo node has), reclaims them all with the
// grace, runs the workflow's tasks, and returns what each step did.
func meterReclaim(b testing.TB, n, grace int, key string) meteredReclaim {
	meter := &unitMeter{}
	env := dynamotest.New(b, dynamotest.WithAPIOptions(meter.apiOption))
	meter.plain = env.Plain
	meter.tables = map[string]string{env.Store.Table: table.State.Suffix, env.Store.AuditTable: table.Audit.Suffix,
		env.Store.KeysTable: table.Keys.Suffix, env.Store.LimitsTable: table.Limits.Suffix}
	ctx := context.Background()
	start := t0.Add(-24 * time.Hour)
	end := t0.Add(30 * 24 * time.Hour)
	var all, released []string
	seed := dynamo.Seed{}
	for i := range n + 2 {
		all = append(all, fmt.Sprintf("gpu-%d", i))
	}
	for i := range n {
		u := all[i+1]
		released = append(released, u)
		seed.VMs = append(seed.VMs, capacity.VM{ID: fmt.Sprintf("vm-spot-%d", i+1), NodeID: "node-a", OrgID: "org-buyer",
			Tier: capacity.TierSpot, UnitIDs: []string{u}, State: capacity.VMRunning, CreatedAt: start, UpdatedAt: start, Version: 1})
	}
	seed.VMs = append(seed.VMs,
		capacity.VM{ID: "vm-res-1", NodeID: "node-a", OrgID: "org-audience", Tier: capacity.TierReserved, UnitIDs: all[:1], State: capacity.VMRunning, CreatedAt: start, UpdatedAt: start, Version: 1},
		capacity.VM{ID: "vm-od-1", NodeID: "node-a", OrgID: "org-buyer", Tier: capacity.TierOnDemand, UnitIDs: all[n+1:], State: capacity.VMRunning, CreatedAt: start, UpdatedAt: start, Version: 1})
	seed.Nodes = []capacity.Node{{ID: "node-a", OwnerOrgID: "org-owner", TopologyGen: 1, AgentEndpoint: "https://agent.node-a.example.com", UnitIDs: all, Version: 1}}
	seed.Reservations = []capacity.Reservation{{
		ID: "res-1", NodeID: "node-a", AllowedOrgIDs: []string{"org-audience"}, ManagingOrgIDs: []string{"org-manager"},
		ReservedUnitIDs: all[:n+1], ReleasedUnitIDs: released, StartsAt: start, EndsAt: &end,
		Status: capacity.StatusActive, ContractRef: "demo-contract-1", CreatedAt: start, UpdatedAt: start, TopologyGen: 1, Version: 1,
	}}
	plain := env.Clean()
	if err := plain.Put(ctx, seed); err != nil {
		b.Fatal(err)
	}
	existing := meter.keys(ctx)
	wfl := &capacitytest.Workflow{}
	svc := &capacity.Service{Store: env.Store, Workflow: wfl, Now: func() time.Time { return t0 }, Logger: quiet}
	limiter := &capacity.RateLimiter{Store: env.Store, Limit: capacity.RateLimit{PerSecond: 10, Burst: 20}, Now: func() time.Time { return t0 }, Logger: quiet}
	p := capacity.Principal{KeyID: "key-0123456789", OrgID: "org-manager", Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: "node-a", ReservationID: "res-1", UnitIDs: released, Reason: "training run", IdempotencyKey: key, GraceSeconds: grace}

	r := meteredReclaim{steps: map[string]*meterStep{}}
	step := func(name string, run func() costunits.Step) {
		meter.reset()
		extra := run()
		u, calls := meter.reset()
		calls.Events, calls.Starts, calls.AgentNotices, calls.AgentCalls = extra.Events, extra.Starts, extra.AgentNotices, extra.AgentCalls
		r.steps[name] = &meterStep{units: u, cost: calls}
	}
	var res *capacity.CapacityResult
	step("api", func() costunits.Step {
		// The api function's rate limiter spends the key's call first (a function instance's
		// first call of the key: one write).
		if err := limiter.Admit(ctx, p); err != nil {
			b.Fatal(err)
		}
		var err error
		res, err = svc.Reclaim(ctx, p, req, capacity.RequestMeta{RequestID: "c0ffee00-1234-4abc-8def-0123456789ab"})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Terminated) != n {
			b.Fatalf("terminated %d VMs, want %d", len(res.Terminated), n)
		}
		return costunits.Step{Starts: len(wfl.Started())}
	})
	after := func(d time.Duration) func() time.Time { return func() time.Time { return t0.Add(d) } }
	step("NotifyAgents", func() costunits.Step {
		agent := &noticeAgent{}
		notifier := &capacity.EvictionNotifier{Store: env.Store, Agent: agent, Now: after(time.Second), Logger: quiet}
		if _, err := notifier.Run(ctx, capacity.NoticeTask{ReclaimID: res.ReclaimID, NodeID: "node-a", Attempt: 1}); err != nil {
			b.Fatal(err)
		}
		return costunits.Step{AgentNotices: len(agent.got)}
	})
	pub := &capacitytest.Publisher{}
	// The report takes its attempt's claim, as the operation-events function wires it.
	announcer := &capacity.Announcer{Store: env.Store, Publisher: pub, Claims: env.Store, Now: after(time.Duration(grace+2) * time.Second), Logger: quiet}
	step("Notify", func() costunits.Step {
		events, err := announcer.Notify(ctx, "node-a", res.ReclaimID, 1)
		if err != nil {
			b.Fatal(err)
		}
		return costunits.Step{Events: events}
	})
	step("TerminateNode", func() costunits.Step {
		agent := &capacitytest.Agent{}
		term := &capacity.Terminator{Store: env.Store, Agent: agent, Now: after(time.Duration(grace+1) * time.Second), Logger: quiet}
		report, err := term.Run(ctx, capacity.TerminationTask{
			ReclaimID: res.ReclaimID, NodeID: "node-a", VMIDs: res.Terminated,
			ExecutionARN: "arn:aws:states:eu-west-1:123456789012:execution:capacity-prod-termination-express:" + res.ReclaimID,
			Attempt:      1, MaxRounds: 5,
		})
		if err != nil || !report.Done {
			b.Fatalf("termination round: %+v, %v", report, err)
		}
		return costunits.Step{AgentCalls: agent.Total()}
	})
	step("Report", func() costunits.Step {
		events, err := announcer.Report(ctx, "node-a", res.ReclaimID, 1)
		if err != nil {
			b.Fatal(err)
		}
		return costunits.Step{Events: events}
	})
	r.stored = meter.created(ctx, existing, t0)
	r.left = meter.createdItems(ctx, existing)
	r.env, r.id = env, res.ReclaimID
	return r
}

// units is what a run of calls consumed: read and write request units (on-demand), and the
// share of each kind of call and item, to print.
type units struct {
	rru, wru float64
	lines    map[string]*line
	order    []string
}

// line is one kind of call on one kind of item: how many, their sizes and units.
type line struct {
	n                int
	minSize, maxSize int
	rru, wru         float64
}

func (u units) String() string {
	var b strings.Builder
	for _, k := range u.order {
		l := u.lines[k]
		size := fmt.Sprintf("%d B", l.minSize)
		if l.maxSize != l.minSize {
			size = fmt.Sprintf("%d-%d B", l.minSize, l.maxSize)
		}
		fmt.Fprintf(&b, "  %3d x %-60s %-12s RRU %5g  WRU %5g\n", l.n, k, size, l.rru, l.wru)
	}
	fmt.Fprintf(&b, "  total RRU %g, WRU %g", u.rru, u.wru)
	return b.String()
}

// unitMeter is SDK middleware that charges each DynamoDB call what AWS would: reads 1 unit per
// 4 KB strongly consistent (half that eventually consistent), summed over the items a Query
// reads and rounded up per call; writes 1 unit per KB of the larger of the item before and
// after, per item, twice that inside a transaction (ConditionCheck included), and each index
// entry the write puts, rewrites or deletes 1 unit per KB. It reads before and after images
// through a client without this middleware, and keeps each call's record for -cost-units.
type unitMeter struct {
	plain  *dynamodb.Client
	tables map[string]string // table name -> its suffix in shared/table ("state", ...)
	mu     sync.Mutex
	cur    units
	calls  costunits.Step
}

func (m *unitMeter) reset() (units, costunits.Step) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u, c := m.cur, m.calls
	m.cur, m.calls = units{}, costunits.Step{}
	// A step's calls may run at once (a round's VMs), in an order that varies from run to run:
	// sorted, units.json is the same on every run of the same code.
	slices.SortStableFunc(c.Reads, func(a, b costunits.Read) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	slices.SortStableFunc(c.Writes, func(a, b costunits.Write) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	return u, c
}

// charge adds one call's (or one transaction item's) units under its kind.
func (m *unitMeter) charge(rru, wru float64, kind string, size int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur.rru += rru
	m.cur.wru += wru
	if m.cur.lines == nil {
		m.cur.lines = map[string]*line{}
	}
	l, ok := m.cur.lines[kind]
	if !ok {
		l = &line{minSize: size, maxSize: size}
		m.cur.lines[kind] = l
		m.cur.order = append(m.cur.order, kind)
	}
	l.n++
	l.minSize, l.maxSize = min(l.minSize, size), max(l.maxSize, size)
	l.rru += rru
	l.wru += wru
}

func (m *unitMeter) record(r *costunits.Read, w *costunits.Write) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r != nil {
		m.calls.Reads = append(m.calls.Reads, *r)
	}
	if w != nil {
		m.calls.Writes = append(m.calls.Writes, *w)
	}
}

// tableDef is the shared/table description of a table by its name.
func (m *unitMeter) tableDef(name string) table.Table {
	for _, t := range table.All {
		if t.Suffix == m.tables[name] {
			return t
		}
	}
	return table.Table{}
}

// keys returns the key of every item in every table, to tell later which items are new.
func (m *unitMeter) keys(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	for name := range m.tables {
		for _, it := range m.scan(ctx, name) {
			out[name+"\x00"+itemKey(it)] = true
		}
	}
	return out
}

// createdItems lists the items not among existing, by table (its suffix: "state", ...).
func (m *unitMeter) createdItems(ctx context.Context, existing map[string]bool) map[string][]map[string]types.AttributeValue {
	out := map[string][]map[string]types.AttributeValue{}
	for _, name := range slices.Sorted(maps.Keys(m.tables)) {
		for _, it := range m.scan(ctx, name) {
			if !existing[name+"\x00"+itemKey(it)] {
				out[m.tables[name]] = append(out[m.tables[name]], it)
			}
		}
	}
	return out
}

// created lists the items not among existing, with how long each stays after now.
func (m *unitMeter) created(ctx context.Context, existing map[string]bool, now time.Time) []costunits.Item {
	var out []costunits.Item
	left := m.createdItems(ctx, existing)
	for _, name := range slices.Sorted(maps.Keys(left)) {
		for _, it := range left[name] {
			c := costunits.Item{Table: name, Attributes: attrSizes(it)}
			if ttl, ok := it[table.TTLAttribute].(*types.AttributeValueMemberN); ok {
				var sec int64
				fmt.Sscan(ttl.Value, &sec)
				c.TTLSeconds = max(0, sec-now.Unix())
			}
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b costunits.Item) int { return strings.Compare(a.Table, b.Table) })
	return out
}

func (m *unitMeter) scan(ctx context.Context, name string) []map[string]types.AttributeValue {
	var items []map[string]types.AttributeValue
	var start map[string]types.AttributeValue
	for {
		out, err := m.plain.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(name), ExclusiveStartKey: start})
		if err != nil {
			return items
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 {
			return items
		}
		start = out.LastEvaluatedKey
	}
}

func itemKey(it map[string]types.AttributeValue) string {
	s := func(k string) string {
		if v, ok := it[k].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		return ""
	}
	return s(table.PartitionKey) + "\x00" + s(table.SortKey)
}

// attrSizes is the size of each attribute of an item (its name and value), as DynamoDB sizes it.
func attrSizes(it map[string]types.AttributeValue) map[string]int {
	if it == nil {
		return nil
	}
	out := make(map[string]int, len(it))
	for k, v := range it {
		out[k] = dynamo.ItemSize(map[string]types.AttributeValue{k: v})
	}
	return out
}

// changedAttrs names the attributes whose value differs between the two images.
func changedAttrs(before, after map[string]types.AttributeValue) []string {
	var out []string
	for k := range maps.Keys(before) {
		if _, ok := after[k]; !ok {
			out = append(out, k)
		}
	}
	for k, v := range after {
		if w, ok := before[k]; !ok || !reflect.DeepEqual(v, w) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

type itemRef struct {
	table string
	key   map[string]types.AttributeValue
	what  string // the kind of write, for the log
}

func (m *unitMeter) apiOption(s *middleware.Stack) error {
	return s.Initialize.Add(middleware.InitializeMiddlewareFunc("unitMeter",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			op := awsmiddleware.GetOperationName(ctx)
			refs := writeRefs(in.Parameters)
			before := m.images(ctx, refs)
			out, md, err := next.HandleInitialize(ctx, in)
			if err != nil {
				return out, md, err // conflicts and failures are not part of a reclaim's cost here
			}
			m.chargeCall(ctx, op, in.Parameters, out.Result, refs, before)
			return out, md, err
		}), middleware.After)
}

// images reads the items the refs name, as they are now (nil where there is none).
func (m *unitMeter) images(ctx context.Context, refs []itemRef) []map[string]types.AttributeValue {
	out := make([]map[string]types.AttributeValue, len(refs))
	for i, r := range refs {
		got, err := m.plain.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(r.table), Key: r.key, ConsistentRead: aws.Bool(true)})
		if err == nil {
			out[i] = got.Item
		}
	}
	return out
}

func (m *unitMeter) chargeCall(ctx context.Context, op string, params, result any, refs []itemRef, before []map[string]types.AttributeValue) {
	switch in := params.(type) {
	case *dynamodb.QueryInput:
		// A Query is charged for every item it reads, before any filter or projection.
		q := *in
		q.FilterExpression, q.ProjectionExpression, q.Select = nil, nil, ""
		all, err := m.plain.Query(ctx, &q)
		if err != nil {
			m.charge(0, 0, "Query (could not re-read: "+err.Error()+")", 0)
			return
		}
		size := 0
		for _, it := range all.Items {
			size += dynamo.ItemSize(it)
		}
		m.record(&costunits.Read{Table: m.tables[aws.ToString(in.TableName)], Op: "Query", Items: len(all.Items), Bytes: size, Consistent: aws.ToBool(in.ConsistentRead)}, nil)
		m.charge(readUnits(size, aws.ToBool(in.ConsistentRead)), 0,
			fmt.Sprintf("Query %s (%d items)", keyKind(map[string]types.AttributeValue{table.PartitionKey: in.ExpressionAttributeValues[firstValue(in.ExpressionAttributeValues)]}), len(all.Items)), size)
	case *dynamodb.GetItemInput:
		size := dynamo.ItemSize(result.(*dynamodb.GetItemOutput).Item)
		items := 0
		if result.(*dynamodb.GetItemOutput).Item != nil {
			items = 1
		}
		m.record(&costunits.Read{Table: m.tables[aws.ToString(in.TableName)], Op: "GetItem", Items: items, Bytes: size, Consistent: aws.ToBool(in.ConsistentRead)}, nil)
		m.charge(readUnits(size, aws.ToBool(in.ConsistentRead)), 0, "GetItem "+keyKind(in.Key), size)
	default:
		after := m.images(ctx, refs)
		factor := 1.0
		if op == "TransactWriteItems" {
			factor = 2
		}
		for i, r := range refs {
			size := max(dynamo.ItemSize(before[i]), dynamo.ItemSize(after[i]))
			m.charge(0, factor*math.Ceil(float64(max(size, 1))/1024), op+" "+r.what+" "+keyKind(r.key), size)
			m.record(nil, &costunits.Write{Table: m.tables[r.table], Op: op + " " + r.what, Transaction: op == "TransactWriteItems",
				Before: attrSizes(before[i]), After: attrSizes(after[i]), Changed: changedAttrs(before[i], after[i])})
			// The indexes (projecting every attribute) are written too, outside the
			// transaction's price: a put or delete of an entry, or both when its key changes.
			for _, ix := range m.tableDef(r.table).Indexes {
				if n := indexWrites(ix, before[i], after[i]); n > 0 {
					m.charge(0, float64(n)*math.Ceil(float64(max(size, 1))/1024), "  "+ix.Name+" index entry of "+keyKind(r.key), size)
				}
			}
		}
	}
}

// indexWrites is how many writes of the index a change of the item makes: its entry is
// rewritten whenever the item is (every attribute is projected), and not at all when the
// item is left as it was (a ConditionCheck).
func indexWrites(ix table.Index, before, after map[string]types.AttributeValue) int {
	if reflect.DeepEqual(before, after) {
		return 0
	}
	key := func(it map[string]types.AttributeValue) string {
		pk, ok1 := it[ix.PartitionKey].(*types.AttributeValueMemberS)
		sk, ok2 := it[ix.SortKey].(*types.AttributeValueMemberS)
		if !ok1 || !ok2 {
			return ""
		}
		return pk.Value + "\x00" + sk.Value
	}
	b, a := key(before), key(after)
	switch {
	case b == "" && a == "":
		return 0
	case b != "" && a != "" && b != a:
		return 2
	}
	return 1
}

// readUnits is the read request units of one read of size bytes: a read of nothing still
// costs the minimum.
func readUnits(size int, consistent bool) float64 {
	u := math.Max(1, math.Ceil(float64(size)/4096))
	if !consistent {
		u /= 2
	}
	return u
}

// writeRefs lists the items a write call writes.
func writeRefs(params any) []itemRef {
	keyOf := func(item map[string]types.AttributeValue) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{table.PartitionKey: item[table.PartitionKey], table.SortKey: item[table.SortKey]}
	}
	switch in := params.(type) {
	case *dynamodb.PutItemInput:
		return []itemRef{{aws.ToString(in.TableName), keyOf(in.Item), "put"}}
	case *dynamodb.UpdateItemInput:
		return []itemRef{{aws.ToString(in.TableName), in.Key, "update"}}
	case *dynamodb.DeleteItemInput:
		return []itemRef{{aws.ToString(in.TableName), in.Key, "delete"}}
	case *dynamodb.TransactWriteItemsInput:
		var refs []itemRef
		for _, it := range in.TransactItems {
			switch {
			case it.Put != nil:
				refs = append(refs, itemRef{aws.ToString(it.Put.TableName), keyOf(it.Put.Item), "put"})
			case it.Update != nil:
				refs = append(refs, itemRef{aws.ToString(it.Update.TableName), it.Update.Key, "update"})
			case it.Delete != nil:
				refs = append(refs, itemRef{aws.ToString(it.Delete.TableName), it.Delete.Key, "delete"})
			case it.ConditionCheck != nil:
				refs = append(refs, itemRef{aws.ToString(it.ConditionCheck.TableName), it.ConditionCheck.Key, "check"})
			}
		}
		return refs
	}
	return nil
}

// keyKind names the kind of item a key is, its ids elided: "NODE#… / VM#…".
func keyKind(key map[string]types.AttributeValue) string {
	var parts []string
	for _, k := range []string{table.PartitionKey, table.SortKey} {
		v, ok := key[k].(*types.AttributeValueMemberS)
		if !ok {
			continue
		}
		segs := strings.Split(v.Value, "#")
		for i, seg := range segs {
			if seg != strings.ToUpper(seg) || strings.ContainsAny(seg, "0123456789") {
				segs[i] = "…"
			}
		}
		parts = append(parts, strings.Join(segs, "#"))
	}
	return strings.Join(parts, " / ")
}

// firstValue returns the name of the first placeholder of a key condition's values (the
// partition key's, for the store's Queries).
func firstValue(vals map[string]types.AttributeValue) string {
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		if _, ok := vals[k].(*types.AttributeValueMemberS); ok {
			return k
		}
	}
	return ""
}
