package main

import (
	"context"
	"strings"
	"testing"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/kmsseal"
	"github.com/openrelay/capacity/shared/stepfn"
)

// TestKMSDecryptOncePerKeyGeneration: a node's KMS-sealed key costs one KMS Decrypt, in the
// first instance that opens it; the next reclaim's notices and round, each in a fresh instance
// (as the workflow's tasks usually land), open the resealed form the first one stored, with
// none. The api function's read of the node leaves that form out.
func TestKMSDecryptOncePerKeyGeneration(t *testing.T) {
	ctx := context.Background()
	gen1 := []byte(strings.Repeat("1", 32))
	f := newFixtureWith(t, nil, func(n *capacity.Node, s *kmsseal.Sealer) {
		sealed, err := s.SealAgentKey(ctx, n.ID, gen1)
		if err != nil {
			t.Fatal(err)
		}
		n.AgentKeyGen, n.AgentKey = 1, sealed
	})
	if err := f.sim.SetNodeKeys(demo.NodeID, gen1); err != nil {
		t.Fatal(err)
	}
	var next stepfn.Task // the second reclaim's notice task
	steps := []struct {
		name string
		// run runs the step in a fresh instance and reports whether the agent took its calls.
		run          func(t *testing.T) bool
		wantDecrypts int32 // in all, after the step
	}{
		{"first reclaim's round: opened with KMS and stored resealed", func(t *testing.T) bool {
			out, err := handler(&capacity.Terminator{Store: f.store, Agent: f.instance(), Logger: quiet}, quiet)(ctx, f.task(t))
			if err != nil {
				t.Fatal(err)
			}
			return len(out.Terminated) == 2
		}, 1},
		{"next reclaim's notices", func(t *testing.T) bool {
			next = f.graceReclaim(t, 2)
			notifier := &capacity.EvictionNotifier{Store: f.store, Agent: f.instance(), Logger: quiet, Budget: noticeBudget}
			out, err := notify(ctx, notifier, quiet, next)
			if err != nil {
				t.Fatal(err)
			}
			return out.Notices["vm-spot-9"] == string(capacity.NoticeDelivered)
		}, 1},
		{"next reclaim's round", func(t *testing.T) bool {
			round := next
			round.AgentNotices, round.VMIDs, round.MaxRounds = false, []string{"vm-spot-9"}, 5
			out, err := handler(&capacity.Terminator{Store: f.store, Agent: f.instance(), Logger: quiet}, quiet)(ctx, round)
			if err != nil {
				t.Fatal(err)
			}
			return len(out.Terminated) == 1
		}, 1},
	}
	for _, s := range steps {
		if !s.run(t) {
			t.Fatalf("%s: the agent did not take the calls", s.name)
		}
		if n := f.kms.n.Load(); n != s.wantDecrypts {
			t.Errorf("%s: %d KMS Decrypts in all, want %d", s.name, n, s.wantDecrypts)
		}
	}
	api, err := f.env.Store.LoadNode(ctx, demo.NodeID, "")
	if err != nil {
		t.Fatal(err)
	}
	if api.Node.ResealedAgentKey != nil {
		t.Errorf("the api's node read returned the resealed key %+v", api.Node.ResealedAgentKey)
	}
	own, err := f.store.LoadNode(ctx, demo.NodeID, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := own.Node.ResealedAgentKey; r == nil || r.Gen != 1 {
		t.Errorf("terminate-node's node read: resealed key %+v, want generation 1's", r)
	}
}
