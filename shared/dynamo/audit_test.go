package dynamo_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

var (
	auditOwner = capacity.Principal{KeyID: "k-owner", OrgID: "owner", Permissions: []string{capacity.PermCapacity, capacity.PermRead}}
	auditOp    = capacity.Principal{KeyID: "k-op", OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}
)

// wholeChain reads the head of one of the node's chains and every page of its records, and
// verifies them.
func wholeChain(t *testing.T, svc *capacity.Service, nodeID string, chain capacity.NodeChain) (capacity.AuditHead, []capacity.AuditRecord, capacity.ChainReport) {
	t.Helper()
	var (
		head capacity.AuditHead
		recs []capacity.AuditRecord
	)
	page := capacity.PageRequest{Limit: 7}
	for i := 0; ; i++ {
		p, err := svc.ListNodeAudit(context.Background(), auditOp, nodeID, chain, page)
		if err != nil {
			t.Fatalf("list node audit: %v", err)
		}
		if i == 0 {
			head = p.Head // the head read before the first page bounds the check
		}
		recs = append(recs, p.Records...)
		if p.NextCursor == "" {
			break
		}
		page.Cursor = p.NextCursor
	}
	return head, recs, capacity.VerifyAuditChain(head, recs)
}

func auditService(store *dynamo.Store) *capacity.Service {
	return &capacity.Service{Store: store, Now: func() time.Time { return t0.Add(time.Hour) },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// onFirstTransact runs fn once, just before the first TransactWriteItems the client sends.
func onFirstTransact(fn func()) func(*middleware.Stack) error {
	var once sync.Once
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("test.BeforeTransact",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if middleware.GetOperationName(ctx) == "TransactWriteItems" {
					once.Do(fn)
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	}
}

// A dry run of another caller appends its record between a reclaim's read and its commit: it
// goes on the node's calls chain, whose head no commit conditions on, so the commit lands in
// one transaction (without a fault) and without deciding again, and each chain holds its record.
func TestCommitAfterConcurrentAppend(t *testing.T) {
	tests := []struct {
		name   string
		faults []awsfault.Rule
	}{
		{"head moved", nil},
		{"head moved, and a transaction conflict", []awsfault.Rule{{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var other *dynamo.Store
			appended := make(chan error, 1)
			own := &dynamotest.Calls{} // the reclaim's calls only, not the other caller's
			opts := []dynamotest.Option{dynamotest.WithAPIOptions(own.Middleware), dynamotest.WithAPIOptions(onFirstTransact(func() {
				appended <- other.AppendAudit(context.Background(), capacity.AuditRecord{ID: "dry-1", Time: t0, NodeID: "n1",
					Action: capacity.ActionReclaim, DryRun: true, Outcome: "ok"})
			}))}
			var inj *awsfault.Injector
			if tt.faults != nil {
				inj = awsfault.New(4, tt.faults...)
				opts = append(opts, dynamotest.WithAPIOptions(inj.APIOption))
			}
			env := dynamotest.New(t, opts...)
			if err := env.Store.Put(context.Background(), seed(4, 2)); err != nil {
				t.Fatal(err)
			}
			other = env.Clean()
			svc := auditService(env.Store)
			own.Reset()
			res, err := svc.Reclaim(context.Background(), auditOwner,
				capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			// Decided once: a moved head alone is no reason to read and decide again.
			if calls := own.Snapshot(); inj == nil && (calls["Query"] != 1 || calls["TransactWriteItems"] != 1) {
				t.Errorf("%d node reads and %d transactions, want 1 and 1", calls["Query"], calls["TransactWriteItems"])
			}
			if err := <-appended; err != nil {
				t.Fatalf("concurrent append: %v", err)
			}
			if !slices.Equal(res.Terminated, []string{"vm00"}) {
				t.Errorf("terminated %v, want [vm00]", res.Terminated)
			}
			head, recs, rep := wholeChain(t, svc, "n1", capacity.ChainChanges)
			if !rep.OK || head.Seq != 1 || len(recs) != 1 || recs[0].ReclaimID != res.ReclaimID {
				t.Fatalf("changes chain %+v, head %+v, records %+v", rep, head, recs)
			}
			if head, dry, rep := wholeChain(t, svc, "n1", capacity.ChainCalls); !rep.OK || head.Seq != 1 || len(dry) != 1 || dry[0].ID != "dry-1" {
				t.Fatalf("calls chain %+v, head %+v, records %+v", rep, head, dry)
			}
			if v := recs[0].Victims; len(v) != 1 || v[0].VMID != "vm00" || v[0].OrgID != "spotbuyer" {
				t.Errorf("reclaim record's victims %+v", v)
			}
			ops := 0
			for _, it := range env.Items(t, env.Store.Table) {
				if ty, ok := it["type"].(*types.AttributeValueMemberS); ok && ty.Value == "operation" {
					ops++
				}
			}
			if ops != 1 {
				t.Errorf("%d operations stored, want 1", ops)
			}
			if inj != nil && inj.Count(awsfault.TransactionConflict) == 0 {
				t.Error("no conflict injected")
			}
		})
	}
}

// Twenty dry runs and a stream of releases and reclaims on one node at once: every call's
// record is on one of the node's chains, once (the changes on the changes chain; dry runs,
// refusals and calls that found nothing to change, such as a reclaim after its release lost
// a race, on the calls chain), and both chains verify.
func TestConcurrentAppendsAndCommitsChain(t *testing.T) {
	env := newEnv(t, seed(4, 0))
	svc := auditService(env.Store)
	ctx := context.Background()
	var wg sync.WaitGroup
	var calls, failed, succeeded atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{fmt.Sprintf("u%d", i%4)}, DryRun: true}
			calls.Add(1)
			if _, err := svc.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{}); err != nil {
				failed.Add(1)
			}
		})
	}
	for i := range 4 {
		wg.Go(func() {
			unit := []string{fmt.Sprintf("u%d", i)}
			for range 3 {
				for _, call := range []func(context.Context, capacity.Principal, capacity.CapacityRequest, capacity.RequestMeta) (*capacity.CapacityResult, error){svc.Release, svc.Reclaim} {
					calls.Add(1)
					if _, err := call(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: unit}, capacity.RequestMeta{}); err != nil {
						failed.Add(1)
					} else {
						succeeded.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Logf("%d of %d calls failed (each still audited)", failed.Load(), calls.Load())
	}
	var recs []capacity.AuditRecord
	for _, chain := range []capacity.NodeChain{capacity.ChainChanges, capacity.ChainCalls} {
		head, got, rep := wholeChain(t, svc, "n1", chain)
		if !rep.OK {
			t.Fatalf("%s chain: %+v", chain, rep)
		}
		if head.Seq != int64(len(got)) {
			t.Errorf("%s chain: %d records, head at %d", chain, len(got), head.Seq)
		}
		for _, r := range got {
			changedNothing := r.DryRun || r.Outcome != "ok" || slices.Equal(r.ReleasedBefore, r.ReleasedAfter) && len(r.Terminated) == 0
			if changedNothing == (chain == capacity.ChainChanges) {
				t.Errorf("%s chain holds %+v", chain, r)
			}
		}
		if chain == capacity.ChainChanges && (len(got) == 0 || int64(len(got)) > succeeded.Load()) {
			t.Errorf("changes chain: %d records for %d releases and reclaims that succeeded", len(got), succeeded.Load())
		}
		recs = append(recs, got...)
	}
	if int64(len(recs)) != calls.Load() {
		t.Errorf("%d records on the chains for %d calls", len(recs), calls.Load())
	}
	ids := map[string]bool{}
	for _, r := range recs {
		if ids[r.ID] {
			t.Errorf("record %s twice", r.ID)
		}
		ids[r.ID] = true
	}
}

// The answer of an append is lost after it landed: the append finds its record under its seq
// and does not put it again.
func TestAppendTimeoutAfterItLanded(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	if err := env.Store.Put(context.Background(), seed(4, 2)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		rec := capacity.AuditRecord{ID: fmt.Sprintf("a%d", i), Time: t0, NodeID: "n1", Action: capacity.ActionReclaim, DryRun: true, Outcome: "ok"}
		if err := env.Store.AppendAudit(ctx, rec); err != nil {
			t.Fatalf("append %s: %v", rec.ID, err)
		}
	}
	if inj.Count(awsfault.AmbiguousTimeout) == 0 {
		t.Fatal("no timeout injected")
	}
	head, recs, rep := wholeChain(t, auditService(env.Clean()), "n1", capacity.ChainCalls)
	if !rep.OK || head.Seq != 2 || len(recs) != 2 {
		t.Fatalf("chain %+v, head %+v, %d records", rep, head, len(recs))
	}
}

// A record for a node that does not exist is not kept: there is no chain to put it on, and
// one put outside a chain could not be told from a planted one. The node's chain, begun
// later, starts pinned with nothing before it.
func TestAppendForMissingNodeKeepsNothing(t *testing.T) {
	env := newEnv(t, seed(4, 2))
	rec := capacity.AuditRecord{ID: "x", Time: t0, NodeID: "n9", Action: capacity.ActionNodePut, Outcome: "invalid_request"}
	if err := env.Store.AppendAudit(context.Background(), rec); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Fatalf("append for a missing node: %v, want not_found", err)
	}
	if items := env.Items(t, env.Store.AuditTable); len(items) != 0 {
		t.Fatalf("audit items %v, want none", items)
	}
	svc := auditService(env.Store)
	if _, err := svc.PutNode(context.Background(), auditOp, capacity.NodeRequest{NodeID: "n9", OwnerOrgID: "owner",
		UnitIDs: []string{"g0"}, AgentEndpoint: "https://n9.example"}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	head, recs, rep := wholeChain(t, svc, "n9", capacity.ChainChanges)
	if !rep.OK || !rep.Pinned || rep.Unchained != 0 || head.Seq != 1 || len(recs) != 1 || head.Start != capacity.ChainStartOf(nil) {
		t.Fatalf("chain %+v, head %+v, records %+v", rep, head, recs)
	}
	// Its calls chain has not begun: it reads as empty, and reading it wrote nothing.
	if head, recs, rep := wholeChain(t, svc, "n9", capacity.ChainCalls); !rep.OK || head != (capacity.AuditHead{}) || len(recs) != 0 {
		t.Fatalf("calls chain %+v, head %+v, records %+v", rep, head, recs)
	}
	if _, err := svc.ListNodeAudit(context.Background(), auditOp, "n8", capacity.ChainCalls, capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Fatalf("calls chain of a node that does not exist: %v, want not_found", err)
	}
}

// The reservation's trail: newest first, paginated, for its owner and managers only.
func TestListReservationAudit(t *testing.T) {
	env := newEnv(t, seed(4, 3)) // u0..u2 released: each reclaim below changes the node
	svc := auditService(env.Store)
	ctx := context.Background()
	for _, u := range []string{"u0", "u1", "u2"} {
		if _, err := svc.Reclaim(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{u}}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	var got []int64
	page := capacity.PageRequest{Limit: 2}
	for {
		p, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", "", page)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			got = append(got, r.Seq)
		}
		if p.NextCursor == "" {
			break
		}
		page.Cursor = p.NextCursor
	}
	if !slices.Equal(got, []int64{3, 2, 1}) {
		t.Errorf("seqs %v, want newest first [3 2 1]", got)
	}
	mgr := capacity.Principal{KeyID: "k-m", OrgID: "mgr", Permissions: []string{capacity.PermRead}}
	if _, err := svc.ListReservationAudit(ctx, mgr, "n1", "r1", "", capacity.PageRequest{}); err != nil {
		t.Errorf("managing org: %v", err)
	}
	for _, p := range []capacity.Principal{
		{KeyID: "k-a", OrgID: "aud", Permissions: []string{capacity.PermRead}},
		{KeyID: "k-x", OrgID: "stranger", Permissions: []string{capacity.PermRead}},
	} {
		if _, err := svc.ListReservationAudit(ctx, p, "n1", "r1", "", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
			t.Errorf("%s: %v, want not_found", p.OrgID, err)
		}
	}
	if _, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", "", capacity.PageRequest{Cursor: "garbage"}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("garbage cursor: %v", err)
	}
	if _, err := svc.ListNodeAudit(ctx, auditOwner, "n1", "", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("node audit for a non-operator: %v", err)
	}
	if _, err := svc.ListNodeAudit(ctx, auditOp, "n1", "everything", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("node audit of an unknown chain: %v, want invalid_request", err)
	}
}

// Sixteen clients send dry runs and refusals at one node while a single writer releases and
// reclaims on it: none of them writes what a commit conditions on, so every commit of the
// writer lands in one transaction and none is refused; the node's version and changes chain
// move by the writer's commits only; and every dry run and refusal is on the calls chain,
// once, which verifies.
func TestCallsThatChangeNothingNeverMakeACommitGoAgain(t *testing.T) {
	own := &dynamotest.Calls{} // the writer's SDK calls only (the clients use env.Plain)
	env := dynamotest.New(t, dynamotest.WithAPIOptions(own.Middleware))
	ctx := context.Background()
	if err := env.Store.Put(ctx, seed(4, 0)); err != nil {
		t.Fatal(err)
	}
	writer := auditService(env.Store)
	readers := auditService(env.Clean())
	const commits = 20
	done := make(chan struct{})
	var wg sync.WaitGroup
	var sent, refused, unexpected atomic.Int64
	for i := range 16 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u1"}, DryRun: true}
				if i%2 == 1 { // a unit the reservation does not hold: refused, and audited
					req = capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"nope"}}
				}
				sent.Add(1)
				_, err := readers.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{})
				switch {
				case err == nil && req.DryRun:
				case err != nil && !req.DryRun && capacity.ErrorCode(err) != capacity.CodeNotFound && capacity.ErrorCode(err) != capacity.CodeInternal:
					refused.Add(1)
				default:
					unexpected.Add(1)
					t.Errorf("%+v: %v", req, err)
				}
			}
		})
	}
	// On a loaded machine the clients may start late: commit only once they are under way
	// (each kind seen), so the commits below really run beside them.
	for deadline := time.Now().Add(30 * time.Second); refused.Load() == 0 || sent.Load() < 2*16; {
		if time.Now().After(deadline) {
			close(done)
			wg.Wait()
			t.Fatalf("clients sent %d calls (%d refused) in 30 s", sent.Load(), refused.Load())
		}
		time.Sleep(time.Millisecond)
	}
	before := sent.Load()
	own.Reset()
	for i := range commits {
		call := writer.Release
		if i%2 == 1 {
			call = writer.Reclaim
		}
		if _, err := call(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{}); err != nil {
			t.Errorf("commit %d: %v", i, err)
		}
	}
	rounds := own.Snapshot()["TransactWriteItems"]
	during := sent.Load() - before
	close(done)
	wg.Wait()
	if rounds != commits {
		t.Errorf("%d transactions for %d commits, want one each", rounds, commits)
	}
	if during == 0 {
		t.Fatalf("no call sent while the writer committed: no contention shown")
	}
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Node.Version != 1+commits || st.Node.AuditHead.Seq != commits {
		t.Errorf("node at version %d, head seq %d; want %d and %d (the writer's commits only)", st.Node.Version, st.Node.AuditHead.Seq, 1+commits, commits)
	}
	if _, recs, rep := wholeChain(t, writer, "n1", capacity.ChainChanges); !rep.OK || len(recs) != commits {
		t.Errorf("changes chain %+v, %d records, want %d", rep, len(recs), commits)
	}
	head, recs, rep := wholeChain(t, writer, "n1", capacity.ChainCalls)
	if !rep.OK || !rep.Pinned || int64(len(recs)) != sent.Load() || head.Seq != sent.Load() {
		t.Fatalf("calls chain %+v, head %+v, %d records, want %d", rep, head, len(recs), sent.Load())
	}
	ids := map[string]bool{}
	for _, r := range recs {
		if ids[r.ID] || r.Action != capacity.ActionReclaim || r.DryRun == (r.Outcome != "ok") {
			t.Errorf("calls chain record %+v (twice, or not a dry run or refusal)", r)
		}
		ids[r.ID] = true
	}
}

// Reads write nothing: not the node item, not a chain's head, not an audit record, even on a
// node whose calls chain has not begun.
func TestReadsWriteNothing(t *testing.T) {
	own := &dynamotest.Calls{}
	env := dynamotest.New(t, dynamotest.WithAPIOptions(own.Middleware))
	ctx := context.Background()
	if err := env.Store.Put(ctx, seed(4, 2)); err != nil {
		t.Fatal(err)
	}
	svc := auditService(env.Store)
	svc.Keys = env.Store
	if _, err := svc.Reclaim(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	state, audit := env.Items(t, env.Store.Table), env.Items(t, env.Store.AuditTable)
	own.Reset()
	reads := []struct {
		name string
		read func() error
	}{
		{"reservation", func() error { _, err := svc.GetReservation(ctx, auditOwner, "n1", "r1"); return err }},
		{"node", func() error { _, err := svc.GetNode(ctx, auditOp, "n1"); return err }},
		{"reservations", func() error { _, err := svc.ListReservations(ctx, auditOp, "n1", capacity.PageRequest{}); return err }},
		{"reservation audit", func() error {
			_, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", "", capacity.PageRequest{})
			return err
		}},
		{"changes chain", func() error {
			_, err := svc.ListNodeAudit(ctx, auditOp, "n1", capacity.ChainChanges, capacity.PageRequest{})
			return err
		}},
		{"calls chain not begun", func() error {
			_, err := svc.ListNodeAudit(ctx, auditOp, "n1", capacity.ChainCalls, capacity.PageRequest{})
			return err
		}},
		{"key chain", func() error { _, err := svc.ListKeyAudit(ctx, auditOp, capacity.PageRequest{}); return err }},
	}
	for _, r := range reads {
		if err := r.read(); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}
	for op, n := range own.Snapshot() {
		if !strings.HasPrefix(op, "Get") && !strings.HasPrefix(op, "Query") && !strings.HasPrefix(op, "Scan") && !strings.HasPrefix(op, "BatchGet") {
			t.Errorf("reads sent %d %s", n, op)
		}
	}
	if !reflect.DeepEqual(env.Items(t, env.Store.Table), state) || !reflect.DeepEqual(env.Items(t, env.Store.AuditTable), audit) {
		t.Error("reads changed the tables")
	}
}
