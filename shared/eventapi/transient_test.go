package eventapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// failingCommits is node-a as the handler's requests name it (org-owner's, reservation res-1
// with a spot VM on its released gpu-2), whose every commit fails with err, as the DynamoDB
// store words it.
type failingCommits struct {
	capacity.Store // nil: any other call panics
	err            error
	commits        int
}

func (s *failingCommits) LoadNode(context.Context, string, string) (*capacity.NodeState, error) {
	units := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
	return &capacity.NodeState{
		Node: capacity.Node{ID: "node-a", OwnerOrgID: "org-owner", TopologyGen: 1, UnitIDs: units, Version: 3},
		Reservations: []capacity.Reservation{{
			ID: "res-1", NodeID: "node-a", ReservedUnitIDs: units, ReleasedUnitIDs: []string{"gpu-2"},
			StartsAt: now.Add(-time.Hour), Status: capacity.StatusActive, TopologyGen: 1, Version: 2,
		}},
		VMs: []capacity.VM{{ID: "vm-1", NodeID: "node-a", OrgID: "buyer", Tier: capacity.TierSpot, UnitIDs: []string{"gpu-2"},
			State: capacity.VMRunning, Version: 1}},
	}, nil
}

func (s *failingCommits) Commit(context.Context, capacity.Commit) error {
	s.commits++
	return fmt.Errorf("commit on node node-a: %w", s.err)
}

func (s *failingCommits) Landed(context.Context, capacity.Commit) (bool, error) { return false, nil }

func (s *failingCommits) AppendAudit(context.Context, capacity.AuditRecord) error { return nil }

// A reclaim request whose commits keep failing for a reason that passes (throttling past the
// retries, commits that kept losing, an outcome still unknown) goes back to the queue to be
// delivered again: no refusal is published for it and it is not acknowledged. The errors are
// the ones the domain service itself answers with after its rounds, not stand-ins.
func TestReclaimThatKeepsFailingTransientlyIsRetriedByTheQueue(t *testing.T) {
	tests := []struct {
		name string
		err  error // every commit's failure
		code capacity.Code
	}{
		{"throttled", capacity.ErrThrottled, capacity.CodeThrottled},
		{"commits kept losing", capacity.ErrConflict, capacity.CodeConcurrentModification},
		{"outcome unknown", capacity.ErrAmbiguous, capacity.CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := &failingCommits{err: tt.err}
			svc := &capacity.Service{Store: store, Now: func() time.Time { return now }, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
				Retry: capacity.RetryPolicy{Detours: 2, Base: time.Millisecond, Cap: time.Millisecond}}
			// What the service answers on its own, so the handler is shown the real form.
			if _, err := svc.Reclaim(context.Background(), capacity.Principal{KeyID: "k", OrgID: "org-owner", Permissions: []string{capacity.PermCapacity}},
				capacity.CapacityRequest{NodeID: "node-a", ReservationID: "res-1", UnitIDs: []string{"gpu-2"}}, capacity.RequestMeta{}); capacity.ErrorCode(err) != tt.code {
				t.Fatalf("the service answers %v, want %s", err, tt.code)
			}
			store.commits = 0
			pub := &capacitytest.Publisher{}
			h := newHandler(nil, pub)
			h.Service = svc
			resp, err := h.Handle(context.Background(), batch(envelope("ev-1", tenant, valid)))
			if err != nil {
				t.Fatal(err)
			}
			if store.commits == 0 {
				t.Fatal("the request never reached a commit")
			}
			if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "msg-1" {
				t.Errorf("batch item failures %+v, want msg-1 back to the queue", resp.BatchItemFailures)
			}
			if len(pub.Published()) != 0 {
				t.Errorf("published %+v, want nothing: the request is not refused, it is retried", pub.Published())
			}
		})
	}
}
