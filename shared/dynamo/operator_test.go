package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// opEnv is seed(4, 1) on an emulator whose store client runs under the injector (nil: none);
// the seed goes in through a client without faults.
func opEnv(t *testing.T, inj *awsfault.Injector) *dynamotest.Env {
	t.Helper()
	env := dynamotest.New(t, dynamotest.Faults(inj)...)
	if err := env.Clean().Put(context.Background(), seed(4, 1)); err != nil {
		t.Fatal(err)
	}
	return env
}

func opAudit(id, node string) capacity.AuditRecord {
	return capacity.AuditRecord{ID: id, Time: t0, Action: capacity.ActionReservationCreate, NodeID: node, Outcome: "ok", Via: capacity.ViaHTTP}
}

// newResCommit creates reservation id on u3 of the node as read.
func newResCommit(st *capacity.NodeState, id string) capacity.OperatorCommit {
	r := capacity.Reservation{ID: id, NodeID: "n1", ReservedUnitIDs: []string{"u3"}, StartsAt: t0, Status: capacity.StatusActive,
		TopologyGen: st.Node.TopologyGen, Version: 1, CreatedAt: t0, UpdatedAt: t0}
	return capacity.OperatorCommit{Node: st.Node, BumpNode: true, NewReservation: &r, Audit: opAudit("a-"+id, "n1")}
}

// stateOf is the state table without the audit head, which appends move.
func stateOf(t *testing.T, env *dynamotest.Env) []map[string]types.AttributeValue {
	t.Helper()
	items := env.Items(t, env.Store.Table)
	for _, it := range items {
		delete(it, "AuditSeq")
		delete(it, "AuditHead")
	}
	return items
}

func TestCommitOperatorCreatesTheNodeAndItsChain(t *testing.T) {
	env := opEnv(t, nil)
	ctx := context.Background()
	n := capacity.Node{ID: "n2", OwnerOrgID: "acme", AgentEndpoint: "https://n2", UnitIDs: []string{"g0", "g1"}, TopologyGen: 1, Version: 1}
	c := capacity.OperatorCommit{Node: capacity.Node{ID: "n2"}, Create: true, NewNode: &n, Audit: opAudit("a1", "n2")}
	c.Audit.Action = capacity.ActionNodePut
	head, err := env.Store.CommitOperator(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := env.Store.GetNode(ctx, "n2")
	if err != nil {
		t.Fatal(err)
	}
	want := n
	want.AuditHead = head
	if !reflect.DeepEqual(*got, want) || head.Seq != 1 || head.Hash == "" {
		t.Fatalf("node = %+v, head %+v; want %+v", *got, head, want)
	}
	// A second create of the node loses: the service re-reads and updates instead.
	c.Audit.ID = "a2"
	if _, err := env.Store.CommitOperator(ctx, c); !errors.Is(err, capacity.ErrConflict) {
		t.Fatalf("second create: %v, want ErrConflict", err)
	}
	if st, err := env.Store.LoadNodeOrNew(ctx, "n9", ""); err != nil || st.Node.ID != "" {
		t.Fatalf("LoadNodeOrNew of a missing node = %+v, %v", st, err)
	}
	if _, err := env.Store.GetNode(ctx, "n9"); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Fatalf("GetNode of a missing node: %v", err)
	}
}

func TestCommitOperatorRaces(t *testing.T) {
	tests := []struct {
		name string
		// between runs after the decision's read and before its commit.
		between func(t *testing.T, s *dynamo.Store, st *capacity.NodeState)
		commit  func(st *capacity.NodeState) capacity.OperatorCommit
		want    error // nil: the commit lands
		seq     int64 // the node chain's head after it lands
	}{
		{
			name: "another write bumped the node",
			between: func(t *testing.T, s *dynamo.Store, st *capacity.NodeState) {
				if _, err := s.CommitOperator(context.Background(), newResCommit(st, "rX")); err != nil {
					t.Fatal(err)
				}
			},
			commit: func(st *capacity.NodeState) capacity.OperatorCommit { return newResCommit(st, "rY") },
			want:   capacity.ErrConflict,
		},
		{
			name: "another write changed the reservation",
			between: func(t *testing.T, s *dynamo.Store, st *capacity.NodeState) {
				// A commit that changes the reservation only checks the node's version.
				r := *st.Reservation("r1")
				r.UpdatedAt = t0.Add(time.Minute)
				if err := s.Commit(context.Background(), capacity.Commit{Node: st.Node, Reservation: &r, Audit: opAudit("other", "n1")}); err != nil {
					t.Fatal(err)
				}
			},
			commit: func(st *capacity.NodeState) capacity.OperatorCommit {
				r := *st.Reservation("r1")
				r.Status = capacity.StatusCancelled
				return capacity.OperatorCommit{Node: st.Node, BumpNode: true, Reservations: []capacity.Reservation{r}, Audit: opAudit("a-c", "n1")}
			},
			want: capacity.ErrConflict,
		},
		{
			name: "only the audit head moved: committed on the new head, no new decision",
			between: func(t *testing.T, s *dynamo.Store, st *capacity.NodeState) {
				// A commit that changes nothing moves the head and only checks the version.
				if err := s.Commit(context.Background(), capacity.Commit{Node: st.Node, Audit: opAudit("no-op", "n1")}); err != nil {
					t.Fatal(err)
				}
			},
			commit: func(st *capacity.NodeState) capacity.OperatorCommit { return newResCommit(st, "rY") },
			seq:    2,
		},
		{
			name: "a refusal was audited meanwhile: on the calls chain, the node untouched",
			between: func(t *testing.T, s *dynamo.Store, st *capacity.NodeState) {
				if err := s.AppendAudit(context.Background(), opAudit("refusal", "n1")); err != nil {
					t.Fatal(err)
				}
			},
			commit: func(st *capacity.NodeState) capacity.OperatorCommit { return newResCommit(st, "rY") },
			seq:    1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := opEnv(t, nil)
			ctx := context.Background()
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			c := tt.commit(st)
			tt.between(t, env.Store, st)
			before := stateOf(t, env)
			_, err = env.Store.CommitOperator(ctx, c)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("got %v, want %v", err, tt.want)
				}
				if !reflect.DeepEqual(stateOf(t, env), before) {
					t.Error("a lost commit wrote")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			after, _ := env.Store.LoadNode(ctx, "n1", "")
			if after.Node.Version != st.Node.Version+1 || after.Node.AuditHead.Seq != tt.seq || after.Reservation("rY") == nil {
				t.Errorf("node version %d head %+v, reservations %v; want version %d, seq %d, rY created",
					after.Node.Version, after.Node.AuditHead, after.Reservations, st.Node.Version+1, tt.seq)
			}
		})
	}
}

func TestCommitOperatorFaults(t *testing.T) {
	tests := []struct {
		fault awsfault.Fault
		want  error
	}{
		{awsfault.TransactionConflict, capacity.ErrConflict},
		{awsfault.Throttling, capacity.ErrThrottled},
		{awsfault.ProvisionedThroughputExceeded, capacity.ErrThrottled},
	}
	for _, tt := range tests {
		t.Run(string(tt.fault), func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: tt.fault, Rate: 1})
			env := opEnv(t, inj)
			ctx := context.Background()
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			before := env.Items(t, env.Store.Table)
			_, err = env.Store.CommitOperator(ctx, newResCommit(st, "r2"))
			if !errors.Is(err, tt.want) || inj.Count(tt.fault) == 0 {
				t.Fatalf("got %v (%d injected), want %v", err, inj.Count(tt.fault), tt.want)
			}
			if !reflect.DeepEqual(env.Items(t, env.Store.Table), before) || len(env.Items(t, env.Store.AuditTable)) != 0 {
				t.Error("a refused transaction wrote")
			}
		})
	}
}

// TestCommitOperatorAmbiguousCreate: the create lands, its answer is lost (or is a server
// error: DynamoDB's 500 says the write may or may not have been applied) and the SDK's retry
// meets the node it made. The store says the outcome is unknown; Landed finds the record.
func TestCommitOperatorAmbiguousCreate(t *testing.T) {
	for _, f := range []awsfault.Fault{awsfault.AmbiguousTimeout, awsfault.InternalServerError} {
		t.Run(string(f), func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: f, Rate: 1})
			env := opEnv(t, inj)
			ctx := context.Background()
			n := capacity.Node{ID: "n2", OwnerOrgID: "acme", AgentEndpoint: "https://n2", UnitIDs: []string{"g0"}, TopologyGen: 1, Version: 1}
			c := capacity.OperatorCommit{Node: capacity.Node{ID: "n2"}, Create: true, NewNode: &n, Audit: opAudit("a1", "n2")}
			_, err := env.Store.CommitOperator(ctx, c)
			if !errors.Is(err, capacity.ErrAmbiguous) || inj.Count(f) == 0 {
				t.Fatalf("got %v (%d injected), want ErrAmbiguous", err, inj.Count(f))
			}
			landed, err := env.Store.Landed(ctx, capacity.Commit{Node: c.Node, Audit: c.Audit})
			if err != nil || !landed {
				t.Fatalf("Landed = %v, %v; want true", landed, err)
			}
			if got := len(env.Items(t, env.Store.AuditTable)); got != 1 {
				t.Errorf("%d audit records, want 1", got)
			}
		})
	}
}

func TestCommitOperatorRefusesTooManyActions(t *testing.T) {
	env := opEnv(t, nil)
	st, err := env.Store.LoadNode(context.Background(), "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	var rs []capacity.Reservation
	for i := range dynamo.MaxTransactItems {
		r := *st.Reservation("r1")
		r.ID = fmt.Sprintf("r%03d", i)
		rs = append(rs, r)
	}
	c := capacity.OperatorCommit{Node: st.Node, BumpNode: true, Reservations: rs, Audit: opAudit("a1", "n1")}
	if _, err := env.Store.CommitOperator(context.Background(), c); err == nil {
		t.Fatal("a transaction over the limit was sent")
	}
}

func TestListReservationsPages(t *testing.T) {
	s := seed(4, 0)
	for _, id := range []string{"r2", "r3", "r4", "r5"} {
		r := s.Reservations[0]
		r.ID = id
		s.Reservations = append(s.Reservations, r)
	}
	s.Nodes = append(s.Nodes, capacity.Node{ID: "n2", OwnerOrgID: "o", UnitIDs: []string{"u0"}, Version: 1})
	r := s.Reservations[0]
	r.ID, r.NodeID = "other", "n2"
	s.Reservations = append(s.Reservations, r)
	env := newEnv(t, s)
	ctx := context.Background()
	tests := []struct {
		limit int
		pages [][]string
	}{
		{2, [][]string{{"r1", "r2"}, {"r3", "r4"}, {"r5"}}},
		{5, [][]string{{"r1", "r2", "r3", "r4", "r5"}}},
		{100, [][]string{{"r1", "r2", "r3", "r4", "r5"}}},
		{1, [][]string{{"r1"}, {"r2"}, {"r3"}, {"r4"}, {"r5"}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.limit), func(t *testing.T) {
			after := ""
			var pages [][]string
			for range 10 {
				rs, more, err := env.Store.ListReservations(ctx, "n1", tt.limit, after)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range rs {
					ids = append(ids, r.ID)
				}
				pages = append(pages, ids)
				if !more {
					break
				}
				after = ids[len(ids)-1]
			}
			if !reflect.DeepEqual(pages, tt.pages) {
				t.Errorf("pages %v, want %v", pages, tt.pages)
			}
		})
	}
	// A page starts after the id named, whether or not a reservation has it, and never
	// leaves the node.
	for _, tc := range []struct {
		node, after string
		want        []string
	}{
		{"n1", "r2", []string{"r3", "r4", "r5"}},
		{"n1", "r2a", []string{"r3", "r4", "r5"}},
		{"n1", "r0", []string{"r1", "r2", "r3", "r4", "r5"}},
		{"n1", "r5", nil},
		{"n1", "zzz", nil},
		{"n2", "a", []string{"other"}},
	} {
		rs, more, err := env.Store.ListReservations(ctx, tc.node, 10, tc.after)
		var ids []string
		for _, r := range rs {
			ids = append(ids, r.ID)
		}
		if err != nil || more || !slices.Equal(ids, tc.want) {
			t.Errorf("%s after %q = %v (more %v), %v; want %v", tc.node, tc.after, ids, more, err, tc.want)
		}
	}
}

// TestCommitOperatorKeepsAgentKeyGenerations: a node created with its sealed agent key, then
// rotated twice, reads back with the generation, the current and previous sealed keys and the
// rotation time each write set; an update that does not rotate leaves them as they were. (The
// node's update then holds more than ten attribute names: run a few times, as the emulator
// once mixed up #1 and #10 depending on map order.)
func TestCommitOperatorKeepsAgentKeyGenerations(t *testing.T) {
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			env := opEnv(t, nil)
			ctx := context.Background()
			n := capacity.Node{ID: "n2", OwnerOrgID: "acme", AgentEndpoint: "https://n2", UnitIDs: []string{"g0"}, TopologyGen: 1, Version: 1,
				AgentKeyGen: 1, AgentKey: []byte("sealed-1")}
			c := capacity.OperatorCommit{Node: capacity.Node{ID: "n2"}, Create: true, NewNode: &n, Audit: opAudit("a0", "n2")}
			if _, err := env.Store.CommitOperator(ctx, c); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				change func(n *capacity.Node)
				want   capacity.Node // the key fields
			}{
				{func(*capacity.Node) {}, capacity.Node{AgentKeyGen: 1, AgentKey: []byte("sealed-1")}},
				{func(n *capacity.Node) {
					n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, []byte("sealed-2"), []byte("sealed-1"), t0
				}, capacity.Node{AgentKeyGen: 2, AgentKey: []byte("sealed-2"), PrevAgentKey: []byte("sealed-1"), AgentKeyRotatedAt: t0}},
				{func(n *capacity.Node) { n.AgentEndpoint = "https://n2b" },
					capacity.Node{AgentKeyGen: 2, AgentKey: []byte("sealed-2"), PrevAgentKey: []byte("sealed-1"), AgentKeyRotatedAt: t0}},
				{func(n *capacity.Node) {
					n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 3, []byte("sealed-3"), []byte("sealed-2"), t0.Add(time.Hour)
				}, capacity.Node{AgentKeyGen: 3, AgentKey: []byte("sealed-3"), PrevAgentKey: []byte("sealed-2"), AgentKeyRotatedAt: t0.Add(time.Hour)}},
			}
			for j, step := range steps {
				read, err := env.Store.GetNode(ctx, "n2")
				if err != nil {
					t.Fatal(err)
				}
				next := *read
				step.change(&next)
				next.Version++
				c := capacity.OperatorCommit{Node: *read, NewNode: &next, Audit: opAudit(fmt.Sprint("a", j+1), "n2")}
				if _, err := env.Store.CommitOperator(ctx, c); err != nil {
					t.Fatal(err)
				}
				got, err := env.Store.GetNode(ctx, "n2")
				if err != nil {
					t.Fatal(err)
				}
				keys := capacity.Node{AgentKeyGen: got.AgentKeyGen, AgentKey: got.AgentKey, PrevAgentKey: got.PrevAgentKey, AgentKeyRotatedAt: got.AgentKeyRotatedAt}
				if !reflect.DeepEqual(keys, step.want) || got.AgentEndpoint != next.AgentEndpoint {
					t.Fatalf("step %d: node %+v, want keys %+v", j, got, step.want)
				}
			}
		})
	}
}
