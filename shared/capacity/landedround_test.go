package capacity_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// lateRounds is lateLanding for capacity and operator commits alike: the first commit's answer
// is lost before it is applied, the first check says it has not landed, and it lands just
// before the next commit, which then fails on what it wrote. The call decided twice; only
// its first round's commit landed.
type lateRounds struct {
	*dynamo.Store
	first   *capacity.Commit
	firstOp *capacity.OperatorCommit
	checked bool
}

func (s *lateRounds) Commit(ctx context.Context, c capacity.Commit) error {
	if s.first == nil {
		s.first = &c
		return fmt.Errorf("commit: %w", capacity.ErrAmbiguous)
	}
	if err := s.Store.Commit(ctx, *s.first); err != nil {
		return fmt.Errorf("late landing: %w", err)
	}
	return s.Store.Commit(ctx, c)
}

func (s *lateRounds) CommitOperator(ctx context.Context, c capacity.OperatorCommit) (capacity.AuditHead, error) {
	if s.firstOp == nil {
		s.firstOp = &c
		return capacity.AuditHead{}, fmt.Errorf("commit: %w", capacity.ErrAmbiguous)
	}
	if _, err := s.Store.CommitOperator(ctx, *s.firstOp); err != nil {
		return capacity.AuditHead{}, fmt.Errorf("late landing: %w", err)
	}
	return s.Store.CommitOperator(ctx, c)
}

func (s *lateRounds) Landed(ctx context.Context, c capacity.Commit) (bool, error) {
	if !s.checked {
		s.checked = true
		return false, nil
	}
	return s.Store.Landed(ctx, c)
}

// A call that decided in several rounds answers with the result of the round whose commit
// landed, not with a later round's decision (which names another reclaim operation, another
// time): the answer says what was written.
func TestCallAnswersTheRoundThatLanded(t *testing.T) {
	tests := []struct {
		name string
		// call makes the call and returns what its answer says was written, and what was.
		call func(t *testing.T, ctx context.Context, svc *capacity.Service, store *dynamo.Store) (answered, stored string)
	}{
		{"reclaim: its operation", func(t *testing.T, ctx context.Context, svc *capacity.Service, store *dynamo.Store) (string, string) {
			res, err := svc.Reclaim(ctx, owner, reclaim("u1"), capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("reclaim: %v", err)
			}
			st, err := store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			return res.ReclaimID, vmIn(st, "s1").ReclaimID
		}},
		{"placement: its VM", func(t *testing.T, ctx context.Context, svc *capacity.Service, store *dynamo.Store) (string, string) {
			res, err := svc.Place(ctx, sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer", Tier: capacity.TierSpot,
				UnitIDs: []string{"u2"}}, capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("placement: %v", err)
			}
			st, err := store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			return res.VM.CreatedAt.String(), vmIn(st, "s9").CreatedAt.String()
		}},
		{"cancel: its reservation", func(t *testing.T, ctx context.Context, svc *capacity.Service, store *dynamo.Store) (string, string) {
			res, err := svc.CancelReservation(ctx, op, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
			if err != nil || res == nil {
				t.Fatalf("cancel: %+v, %v", res, err)
			}
			st, err := store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			r := st.Reservation("r1")
			return fmt.Sprint(res.Reservation.UpdatedAt, res.Reservation.Version), fmt.Sprint(r.UpdatedAt, r.Version)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			clock := t0.Add(time.Hour)
			svc.Now = func() time.Time { clock = clock.Add(time.Second); return clock } // each round decides at its own time
			store := &lateRounds{Store: env.Store}
			svc.Store = store
			answered, stored := tt.call(t, context.Background(), svc, env.Store)
			if store.first == nil && store.firstOp == nil || !store.checked {
				t.Fatal("the call never decided again after its first commit's answer was lost")
			}
			if answered != stored {
				t.Errorf("answered %s, but what landed is %s", answered, stored)
			}
		})
	}
}

// vmIn returns the node's VM id (zero if none).
func vmIn(st *capacity.NodeState, id string) capacity.VM {
	for _, vm := range st.VMs {
		if vm.ID == id {
			return vm
		}
	}
	return capacity.VM{}
}
