package capacity_test

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// countedLoads is a store counting its node reads.
type countedLoads struct {
	capacity.Store
	loads *atomic.Int32
}

func (s countedLoads) LoadNode(ctx context.Context, nodeID, scope string) (*capacity.NodeState, error) {
	s.loads.Add(1)
	return s.Store.LoadNode(ctx, nodeID, scope)
}

// A capacity call whose rate limiter, run beside its read, refused it answers the refusal
// after the read and writes nothing to the DynamoDB store: no item of the state or audit
// table changes, and no call outcome is recorded (the limiter counts its refusals). Admitted,
// the same call writes.
func TestRefusedAdmissionWritesNothing(t *testing.T) {
	place := capacity.PlacementRequest{NodeID: "n1", VMID: "s2", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"u2"}}
	keyed := reclaim("u1")
	keyed.IdempotencyKey = "k1"
	dry := reclaim("u1")
	dry.DryRun = true
	tests := []struct {
		name string
		call func(ctx context.Context, svc *capacity.Service) error
	}{
		{"reclaim", func(ctx context.Context, svc *capacity.Service) error {
			_, err := svc.Reclaim(ctx, owner, keyed, capacity.RequestMeta{})
			return err
		}},
		{"dry run", func(ctx context.Context, svc *capacity.Service) error {
			_, err := svc.Reclaim(ctx, owner, dry, capacity.RequestMeta{})
			return err
		}},
		{"reclaim by the audience, a refusal that would be audited", func(ctx context.Context, svc *capacity.Service) error {
			_, err := svc.Reclaim(ctx, audi, reclaim("u1"), capacity.RequestMeta{})
			return err
		}},
		{"release of a unit in use, a refusal that would be audited", func(ctx context.Context, svc *capacity.Service) error {
			_, err := svc.Release(ctx, owner, reclaim("u0"), capacity.RequestMeta{})
			return err
		}},
		{"placement", func(ctx context.Context, svc *capacity.Service) error {
			_, err := svc.Place(ctx, sched, place, capacity.RequestMeta{})
			return err
		}},
	}
	refusal := capacity.Errorf(capacity.CodeRateLimited, "over")
	refusal.RetryAfter = time.Second
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := world(t)
			m := &recordedMetrics{}
			var loads atomic.Int32
			svc.Metrics, svc.Store = m, countedLoads{env.Store, &loads}
			state, audit := env.Items(t, env.Store.Table), env.Items(t, env.Store.AuditTable)

			ctx := capacity.WithAdmission(context.Background(), capacity.StartAdmission(func() error { return refusal }))
			if err := tt.call(ctx, svc); err != refusal {
				t.Fatalf("refused: %v, want the limiter's refusal", err)
			}
			if loads.Load() == 0 {
				t.Errorf("the node was not read")
			}
			if !reflect.DeepEqual(env.Items(t, env.Store.Table), state) || !reflect.DeepEqual(env.Items(t, env.Store.AuditTable), audit) {
				t.Errorf("a refused call wrote to the store")
			}
			if len(m.calls) != 0 {
				t.Errorf("a refused call was recorded: %+v", m.calls)
			}

			admitted := capacity.WithAdmission(context.Background(), capacity.StartAdmission(func() error { return nil }))
			tt.call(admitted, svc)
			if reflect.DeepEqual(env.Items(t, env.Store.AuditTable), audit) || len(m.calls) != 1 {
				t.Errorf("admitted: no audit record or %d call outcomes, want a write and 1", len(m.calls))
			}
		})
	}
}
