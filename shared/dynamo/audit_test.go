package dynamo_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
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

// wholeChain reads the node's head and every page of its records, and verifies them.
func wholeChain(t *testing.T, svc *capacity.Service, nodeID string) (capacity.AuditHead, []capacity.AuditRecord, capacity.ChainReport) {
	t.Helper()
	var (
		head capacity.AuditHead
		recs []capacity.AuditRecord
	)
	page := capacity.PageRequest{Limit: 7}
	for i := 0; ; i++ {
		p, err := svc.ListNodeAudit(context.Background(), auditOp, nodeID, page)
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

// A dry run of another caller appends its record between a reclaim's read and its commit:
// the commit loses only the audit head, goes again on the new head without deciding again,
// and the chain holds both records in order.
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
			opts := []dynamotest.Option{dynamotest.WithAPIOptions(onFirstTransact(func() {
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
			other = dynamo.New(env.Plain, env.Store.Table, env.Store.AuditTable)
			svc := auditService(env.Store)
			env.Calls.Reset()
			res, err := svc.Reclaim(context.Background(), auditOwner,
				capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}}, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			// Decided once: a moved head alone is no reason to read and decide again.
			if q := env.Calls.Snapshot()["Query"]; inj == nil && q != 1 {
				t.Errorf("%d node reads, want 1", q)
			}
			if err := <-appended; err != nil {
				t.Fatalf("concurrent append: %v", err)
			}
			if !slices.Equal(res.Terminated, []string{"vm00"}) {
				t.Errorf("terminated %v, want [vm00]", res.Terminated)
			}
			head, recs, rep := wholeChain(t, svc, "n1")
			if !rep.OK || head.Seq != 2 || len(recs) != 2 || recs[0].ID != "dry-1" || recs[1].ReclaimID != res.ReclaimID {
				t.Fatalf("chain %+v, head %+v, records %+v", rep, head, recs)
			}
			if v := recs[1].Victims; len(v) != 1 || v[0].VMID != "vm00" || v[0].OrgID != "spotbuyer" {
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
// record is on the chain, once, and the chain verifies.
func TestConcurrentAppendsAndCommitsChain(t *testing.T) {
	env := newEnv(t, seed(4, 0))
	svc := auditService(env.Store)
	ctx := context.Background()
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{fmt.Sprintf("u%d", i%4)}, DryRun: true}
			calls.Add(1)
			if _, err := svc.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{}); err != nil {
				failed.Add(1)
			}
		}()
	}
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unit := []string{fmt.Sprintf("u%d", i)}
			for range 3 {
				for _, call := range []func(context.Context, capacity.Principal, capacity.CapacityRequest, capacity.RequestMeta) (*capacity.CapacityResult, error){svc.Release, svc.Reclaim} {
					calls.Add(1)
					if _, err := call(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: unit}, capacity.RequestMeta{}); err != nil {
						failed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Logf("%d of %d calls failed (each still audited)", failed.Load(), calls.Load())
	}
	head, recs, rep := wholeChain(t, svc, "n1")
	if !rep.OK {
		t.Fatalf("chain: %+v", rep)
	}
	if int64(len(recs)) != calls.Load() || head.Seq != calls.Load() {
		t.Errorf("%d records, head at %d, for %d calls", len(recs), head.Seq, calls.Load())
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
	head, recs, rep := wholeChain(t, auditService(dynamo.New(env.Plain, env.Store.Table, env.Store.AuditTable)), "n1")
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
	head, recs, rep := wholeChain(t, svc, "n9")
	if !rep.OK || !rep.Pinned || rep.Unchained != 0 || head.Seq != 1 || len(recs) != 1 || head.Start != capacity.ChainStartOf(nil) {
		t.Fatalf("chain %+v, head %+v, records %+v", rep, head, recs)
	}
}

// The reservation's trail: newest first, paginated, for its owner and managers only.
func TestListReservationAudit(t *testing.T) {
	env := newEnv(t, seed(4, 2))
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
		p, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", page)
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
	if _, err := svc.ListReservationAudit(ctx, mgr, "n1", "r1", capacity.PageRequest{}); err != nil {
		t.Errorf("managing org: %v", err)
	}
	for _, p := range []capacity.Principal{
		{KeyID: "k-a", OrgID: "aud", Permissions: []string{capacity.PermRead}},
		{KeyID: "k-x", OrgID: "stranger", Permissions: []string{capacity.PermRead}},
	} {
		if _, err := svc.ListReservationAudit(ctx, p, "n1", "r1", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
			t.Errorf("%s: %v, want not_found", p.OrgID, err)
		}
	}
	if _, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", capacity.PageRequest{Cursor: "garbage"}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("garbage cursor: %v", err)
	}
	if _, err := svc.ListNodeAudit(ctx, auditOwner, "n1", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("node audit for a non-operator: %v", err)
	}
}
