package capacity_test

import (
	"context"
	"fmt"
	"maps"
	"math"
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
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/table"
)

// BenchmarkReclaimUnits reports the DynamoDB on-demand read and write units one reclaim
// costs, from the sizes of the items each call reads and writes (the emulator reports no
// consumed capacity): the API call (decision Query, the transaction), then the termination
// workflow's rounds for its victims, with an agent that terminates every VM at once. Run with
// -v for the cost of each call and the size of each item written (docs/cost.md).
//
//	go test -run '^$' -bench ReclaimUnits -benchtime 1x -v ./shared/capacity
func BenchmarkReclaimUnits(b *testing.B) {
	for _, tc := range []struct {
		name    string
		victims int
		key     string // Idempotency-Key
	}{
		{"typical/2-victims", 2, ""},
		{"typical/2-victims/idempotency-key", 2, "k-0123456789abcdef"},
		{"largest/64-victims/idempotency-key", 64, "k-0123456789abcdef"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var api, wf units
			for b.Loop() {
				api, wf = meterReclaim(b, tc.victims, tc.key)
			}
			b.ReportMetric(api.rru, "api-RRU")
			b.ReportMetric(api.wru, "api-WRU")
			b.ReportMetric(wf.rru, "workflow-RRU")
			b.ReportMetric(wf.wru, "workflow-WRU")
			b.ReportMetric(0, "ns/op") // the figures are the units, not the emulator's time
			b.Logf("API call:\n%s\nworkflow:\n%s", api, wf)
		})
	}
}

// meterReclaim seeds a node whose reservation has released units under n spot VMs (one unit
// each, plus a reserved and an on-demand VM as the demo node has), reclaims them all, runs the
// workflow's round, and returns the units each side consumed.
func meterReclaim(b *testing.B, n int, key string) (api, wf units) {
	meter := &unitMeter{}
	env := dynamotest.New(b, dynamotest.WithAPIOptions(meter.apiOption))
	meter.plain = env.Plain
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
	wfl := &capacitytest.Workflow{}
	svc := &capacity.Service{Store: env.Store, Workflow: wfl, Now: func() time.Time { return t0 }, Logger: quiet}
	p := capacity.Principal{KeyID: "key-0123456789", OrgID: "org-manager", Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: "node-a", ReservationID: "res-1", UnitIDs: released, Reason: "training run", IdempotencyKey: key}

	meter.reset()
	res, err := svc.Reclaim(ctx, p, req, capacity.RequestMeta{RequestID: "c0ffee00-1234-4abc-8def-0123456789ab"})
	if err != nil {
		b.Fatal(err)
	}
	if len(res.Terminated) != n {
		b.Fatalf("terminated %d VMs, want %d", len(res.Terminated), n)
	}
	api = meter.reset()

	term := &capacity.Terminator{Store: env.Store, Agent: &capacitytest.Agent{}, Now: func() time.Time { return t0.Add(time.Second) }, Logger: quiet}
	report, err := term.Run(ctx, capacity.TerminationTask{
		ReclaimID: res.ReclaimID, NodeID: "node-a", VMIDs: res.Terminated,
		ExecutionARN: "arn:aws:states:us-east-1:123456789012:execution:capacity-prod-termination:" + res.ReclaimID,
		Attempt:      1, MaxRounds: 5,
	})
	if err != nil || !report.Done {
		b.Fatalf("termination round: %+v, %v", report, err)
	}
	return api, meter.reset()
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
// after, per item, twice that inside a transaction (ConditionCheck included). It reads
// before and after images through a client without this middleware.
type unitMeter struct {
	plain *dynamodb.Client
	mu    sync.Mutex
	cur   units
}

func (m *unitMeter) reset() units {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.cur
	m.cur = units{}
	return u
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
		m.charge(readUnits(size, aws.ToBool(in.ConsistentRead)), 0,
			fmt.Sprintf("Query %s (%d items)", keyKind(map[string]types.AttributeValue{table.PartitionKey: in.ExpressionAttributeValues[firstValue(in.ExpressionAttributeValues)]}), len(all.Items)), size)
	case *dynamodb.GetItemInput:
		size := dynamo.ItemSize(result.(*dynamodb.GetItemOutput).Item)
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
			// The indexes (projecting every attribute) are written too, outside the
			// transaction's price: a put or delete of an entry, or both when its key changes.
			for _, ix := range table.State.Indexes {
				if n := indexWrites(ix, before[i], after[i]); n > 0 {
					m.charge(0, float64(n)*math.Ceil(float64(max(size, 1))/1024), "  "+ix.Name+" index entry of "+keyKind(r.key), size)
				}
			}
		}
	}
}

// indexWrites is how many writes of the index a change of the item makes: its entry is
// rewritten whenever the item is (every attribute is projected).
func indexWrites(ix table.Index, before, after map[string]types.AttributeValue) int {
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
