package capacity_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// nodeItem returns the node item of n1 as stored (every attribute: version, changes chain head).
func nodeItem(t *testing.T, env *dynamotest.Env) map[string]types.AttributeValue {
	t.Helper()
	for _, it := range env.Items(t, env.Store.Table) {
		if attrString(it["pk"]) == "NODE#n1" && attrString(it["sk"]) == "NODE" {
			return it
		}
	}
	t.Fatal("no node item")
	return nil
}

// chainOf reads one of n1's chains whole and verifies it, as audit verify does.
func chainOf(t *testing.T, svc *capacity.Service, chain capacity.NodeChain) ([]capacity.AuditRecord, capacity.ChainReport) {
	t.Helper()
	var recs []capacity.AuditRecord
	var head capacity.AuditHead
	page := capacity.PageRequest{}
	for i := 0; ; i++ {
		p, err := svc.ListNodeAudit(context.Background(), op, "n1", chain, page)
		if err != nil {
			t.Fatalf("list %s chain: %v", chain, err)
		}
		if i == 0 {
			head = p.Head
		}
		recs = append(recs, p.Records...)
		if p.NextCursor == "" {
			return recs, capacity.VerifyAuditChain(head, recs)
		}
		page.Cursor = p.NextCursor
	}
}

// A call that changes nothing (a repeat of a change already made) writes nothing a commit
// conditions on: the node item, its version and its changes chain head, stay byte for byte
// as they were, and so does every other item a decision reads; the call's record goes on the
// calls chain, as a dry run's does; both chains verify; and the call answers as it always
// did (200 with the state as it is). Under an Idempotency-Key its retry replays that answer.
func TestCallsThatChangeNothingLeaveTheNodeAlone(t *testing.T) {
	ctx := context.Background()
	release := func(key string) func(*capacity.Service) (any, error) {
		return func(svc *capacity.Service) (any, error) {
			req := reclaim("u2")
			req.IdempotencyKey = key
			return svc.Release(ctx, owner, req, capacity.RequestMeta{})
		}
	}
	putNode := func(svc *capacity.Service) (any, error) {
		return svc.PutNode(ctx, op, capacity.NodeRequest{NodeID: "n1", OwnerOrgID: "owner", AgentEndpoint: "https://n1.example",
			UnitIDs: []string{"u0", "u1", "u2", "u3"}}, capacity.RequestMeta{})
	}
	cancel := func(svc *capacity.Service) (any, error) {
		return svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1", Reason: "contract ended"}, capacity.RequestMeta{})
	}
	var failedID string // the failed operation of failedWorld
	failedWorld := func(t *testing.T) (*dynamotest.Env, *capacity.Service) {
		env, svc, failed, _ := failedOp(t)
		failedID = failed.ID
		return env, svc
	}
	forceEndS2 := func(svc *capacity.Service) (any, error) {
		return svc.ForceEnd(ctx, op, forceEnd(failedID, "s2", "node wiped, ticket OPS-7", ""), capacity.RequestMeta{})
	}
	tests := []struct {
		name string
		// setup makes the world (nil: world).
		setup func(*testing.T) (*dynamotest.Env, *capacity.Service)
		// prepare makes the change the call then repeats (nil: the world as seeded has it).
		prepare func(*capacity.Service) (any, error)
		call    func(*capacity.Service) (any, error)
		// want checks the answer against the node as stored after the call.
		want func(t *testing.T, answer any, st *capacity.NodeState)
		// key: the call carries an Idempotency-Key, and its retry must replay.
		key bool
	}{
		{"release of units already released", nil, nil, release(""), func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.CapacityResult)
			if !reflect.DeepEqual(res.Reservation, st.Reservations[0]) || res.Replayed || res.DryRun {
				t.Errorf("answer %+v, want the reservation as stored %+v", res, st.Reservations[0])
			}
		}, false},
		{"release of units already released, with an Idempotency-Key", nil, nil, release("rel-1"), func(t *testing.T, a any, st *capacity.NodeState) {
			if res := a.(*capacity.CapacityResult); !reflect.DeepEqual(res.Reservation, st.Reservations[0]) {
				t.Errorf("answer %+v, want the reservation as stored %+v", res, st.Reservations[0])
			}
		}, true},
		{"reclaim of units already exclusive, nothing to evict", nil, nil, func(svc *capacity.Service) (any, error) {
			return svc.Reclaim(ctx, owner, reclaim("u0"), capacity.RequestMeta{})
		}, func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.CapacityResult)
			if !reflect.DeepEqual(res.Reservation, st.Reservations[0]) || len(res.Terminated) != 0 || res.ReclaimID != "" ||
				!slices.Equal(res.Skipped, []string{"v0"}) {
				t.Errorf("answer %+v, want the reservation as stored, nothing terminated, v0 skipped", res)
			}
		}, false},
		{"topology reaffirmed (the same units)", nil, nil, func(svc *capacity.Service) (any, error) {
			return svc.SetTopology(ctx, op, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u3", "u2", "u1", "u0"}}, capacity.RequestMeta{})
		}, func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.TopologyResult)
			if res.Changed || !reflect.DeepEqual(res.Node, st.Node) || len(res.AddedUnitIDs)+len(res.RemovedUnitIDs)+len(res.NeedsReview) != 0 {
				t.Errorf("answer %+v, want unchanged and the node as stored %+v", res, st.Node)
			}
		}, false},
		{"node put again as it is", nil, putNode, putNode, func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.NodeResult)
			if res.Created || res.AgentKey != nil || !reflect.DeepEqual(res.Node, st.Node) {
				t.Errorf("answer %+v, want the node as stored %+v", res, st.Node)
			}
		}, false},
		{"reservation cancelled again", nil, cancel, cancel, func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.ReservationResult)
			if !reflect.DeepEqual(res.Reservation, st.Reservations[0]) || res.Reservation.Status != capacity.StatusCancelled ||
				!slices.Equal(capacity.VMIDs(res.VMsOnUnits), []string{"s1", "v0"}) {
				t.Errorf("answer %+v, want the cancelled reservation as stored and its VMs", res)
			}
		}, false},
		{"force-end of a VM already force-ended", failedWorld, forceEndS2, forceEndS2, func(t *testing.T, a any, st *capacity.NodeState) {
			res := a.(*capacity.ForceEndResult)
			if res.Outcome != capacity.OutcomeForceEnded || res.Ended || res.Operation.State != capacity.OpCompleted {
				t.Errorf("answer %+v, want force-ended, the operation completed, nothing ended now", res)
			}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setup := tt.setup
			if setup == nil {
				setup = world
			}
			env, svc := setup(t)
			if tt.prepare != nil {
				if _, err := tt.prepare(svc); err != nil {
					t.Fatalf("prepare: %v", err)
				}
			}
			// Every item a decision reads (the node's partition from the node item on) and the
			// changes chain, as they were.
			node := nodeItem(t, env)
			before, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			changes, _ := chainOf(t, svc, capacity.ChainChanges)
			calls, _ := chainOf(t, svc, capacity.ChainCalls)

			answer, err := tt.call(svc)
			if err != nil {
				t.Fatal(err)
			}
			if got := nodeItem(t, env); !reflect.DeepEqual(got, node) {
				t.Errorf("node item written:\n got %v\nwant %v", got, node)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(st, before) {
				t.Errorf("the node's state moved:\n got %+v\nwant %+v", st, before)
			}
			tt.want(t, answer, st)
			if tt.key {
				again, err := tt.call(svc)
				if err != nil || !again.(*capacity.CapacityResult).Replayed {
					t.Fatalf("retry under the key: %+v, %v; want a replay", again, err)
				}
				// The same body: the result as encoded.
				if got, want := mustJSON(t, again), mustJSON(t, answer); got != want {
					t.Errorf("replay %s, want %s", got, want)
				}
				if got := nodeItem(t, env); !reflect.DeepEqual(got, node) {
					t.Errorf("node item written by the replay")
				}
			}

			recs, rep := chainOf(t, svc, capacity.ChainChanges)
			if !rep.OK || len(recs) != len(changes) {
				t.Errorf("changes chain %+v, %d records; want it verified, with the %d it had", rep, len(recs), len(changes))
			}
			recs, rep = chainOf(t, svc, capacity.ChainCalls)
			added := recs[min(len(calls), len(recs)):]
			wantAdded := 1
			if tt.key {
				wantAdded = 2 // the call, then its replay
			}
			if !rep.OK || len(added) != wantAdded || added[0].Outcome != "ok" || added[0].DryRun {
				t.Fatalf("calls chain %+v, records added %+v; want it verified, with the call's record (ok, not a dry run)", rep, added)
			}
			if tt.key && added[1].Outcome != capacity.OutcomeReplayed {
				t.Errorf("replay recorded as %+v", added[1])
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A repeat whose record meets transaction conflicts and answers lost after it landed (as on
// AWS) still answers the state as it is, leaves the node item alone, and is on the calls
// chain once; under an Idempotency-Key its retry replays.
func TestRepeatUnderFaultsIsRecordedOnce(t *testing.T) {
	for _, key := range []string{"", "rel-1"} {
		t.Run("key "+key, func(t *testing.T) {
			env, svc, inj := faultyWorld(t, 3,
				awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 0.5},
				awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.3})
			svc.Attempts = 6
			ctx := context.Background()
			node := nodeItem(t, env)
			req := reclaim("u2") // released already
			req.IdempotencyKey = key
			for i := range 3 {
				res, err := svc.Release(ctx, owner, req, capacity.RequestMeta{RequestID: "repeat"})
				if err != nil {
					t.Fatalf("release %d: %v", i, err)
				}
				if !slices.Equal(res.Reservation.ReleasedUnitIDs, []string{"u1", "u2"}) || res.Reservation.Version != 1 || res.Replayed != (key != "" && i > 0) {
					t.Errorf("release %d answered %+v", i, res)
				}
			}
			if inj.Count(awsfault.AmbiguousTimeout) == 0 {
				t.Error("no lost answer injected")
			}
			if got := nodeItem(t, env); !reflect.DeepEqual(got, node) {
				t.Errorf("node item written")
			}
			recs, rep := chainOf(t, svc, capacity.ChainCalls)
			ids := map[string]bool{}
			for _, r := range recs {
				if ids[r.ID] {
					t.Errorf("record %s twice", r.ID)
				}
				ids[r.ID] = true
			}
			want := 3 // each call once: with a key, the first and two replays
			if !rep.OK || len(recs) != want {
				t.Errorf("calls chain %+v, %d records, want %d", rep, len(recs), want)
			}
		})
	}
}
