package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// TestAgentKeyRotationWhileTerminationsRun: an operator rotates a node's agent key while a
// reclaim's terminations run, before the agent has the new key: every VM is still terminated
// once (the service falls back on the previous key while the agent refuses the new one).
// Once the new key is installed the service needs no fallback, the agent accepts the old key
// for the overlap only, and a change of owner rotates the key again, which terminate-node
// stores resealed once it has opened it.
func TestAgentKeyRotationWhileTerminationsRun(t *testing.T) {
	ctx := context.Background()
	node := newNode(t, func(s *dynamo.Seed) {
		at := s.VMs[0].CreatedAt
		for _, vm := range []struct{ id, unit string }{{"vm-spot-3", "gpu-4"}, {"vm-spot-4", "gpu-5"}} {
			s.VMs = append(s.VMs, capacity.VM{ID: vm.id, NodeID: s.Nodes[0].ID, OrgID: demo.OrgBuyer, Tier: capacity.TierSpot,
				UnitIDs: []string{vm.unit}, State: capacity.VMRunning, CreatedAt: at, UpdatedAt: at, Version: 1})
		}
	})
	derived, err := agent.NodeKey(masterSecret, node)
	if err != nil {
		t.Fatal(err)
	}
	const overlap = 3 * time.Second // the agent's, shortened for the test; the service's is 10 min
	agents.SetKeyOverlap(overlap)
	t.Cleanup(func() { agents.SetKeyOverlap(0) })
	agents.SetLatency(node, "", 300*time.Millisecond)

	reclaim := func(key string, units ...string) string {
		t.Helper()
		r := call(t, http.MethodPost, reclaimPath(node), key, map[string]any{"unitIds": units})
		if r.Status != http.StatusOK {
			t.Fatalf("reclaim %v: %d %s", units, r.Status, r.Body)
		}
		return r.json(t)["reclaimId"].(string)
	}
	rotate := func() (key []byte, gen float64) {
		t.Helper()
		r := call(t, http.MethodPost, "/v1/nodes/"+node+"/agent-key/rotate", keyOperator, map[string]any{"reason": "test"})
		if r.Status != http.StatusOK {
			t.Fatalf("rotate: %d %s", r.Status, r.Body)
		}
		body := r.json(t)
		k, err := base64.StdEncoding.DecodeString(body["agentKey"].(string))
		if err != nil || len(k) != capacity.AgentKeyBytes {
			t.Fatalf("rotate answered %s", r.Body)
		}
		return k, body["agentKeyGen"].(float64)
	}
	completed := func(id string, vms ...string) {
		t.Helper()
		op := awaitOperation(t, node, id, 2*time.Minute)
		if op["state"] != "completed" {
			t.Fatalf("operation %s: %v", id, op)
		}
		for _, vm := range vms {
			if n := agents.Terminations(node, vm); n != 1 || agents.State(node, vm) != agent.StateTerminated {
				t.Errorf("%s: %d terminations, state %s", vm, n, agents.State(node, vm))
			}
		}
	}

	// 1. Rotate while the first reclaim's terminations run; the agent holds only the
	// derived key (generation 0).
	first := reclaim(keyOwner, "gpu-2", "gpu-3")
	key1, gen := rotate()
	if gen != 1 {
		t.Fatalf("first rotation of a derived key: generation %v, want 1", gen)
	}
	completed(first, "vm-spot-1", "vm-spot-2")

	// 2. The operator installs the new key; the old one still works for the overlap.
	if err := agents.RotateNodeKey(node, key1); err != nil {
		t.Fatal(err)
	}
	former := &agent.Client{Keys: agent.KeySet{Current: derived}, AllowHTTP: true}
	if _, err := former.Status(ctx, agents.Endpoint(node), node, "vm-res-1"); err != nil {
		t.Fatalf("the previous key within the overlap: %v", err)
	}
	refused := agents.Refused()
	second := reclaim(keyOwner, "gpu-4")
	completed(second, "vm-spot-3")
	if n := agents.Refused() - refused; n != 0 {
		t.Errorf("%d requests refused once the agent had the new key, want 0 (no fallback needed)", n)
	}

	// 3. After the overlap the agent refuses the previous key: whoever holds only it signs
	// nothing the agent accepts.
	time.Sleep(overlap)
	if _, err := former.Status(ctx, agents.Endpoint(node), node, "vm-res-1"); err == nil || agent.IsRetryable(err) {
		t.Fatalf("the previous key after the overlap: %v, want a refusal", err)
	}

	// 4. A new owner gets a new key (generation 2), handed out once; until it is installed,
	// the service falls back on generation 1, which the agent holds.
	r := call(t, http.MethodPut, "/v1/nodes/"+node, keyOperator, map[string]any{
		"ownerOrgId": "org-new-owner", "unitIds": demo.Seed(time.Now()).Nodes[0].UnitIDs, "agentEndpoint": agents.Endpoint(node), "reason": "sold"})
	if r.Status != http.StatusOK {
		t.Fatalf("owner change: %d %s", r.Status, r.Body)
	}
	put := r.json(t)
	key2, _ := base64.StdEncoding.DecodeString(put["agentKey"].(string))
	if gen := put["node"].(map[string]any)["agentKeyGen"]; len(key2) != capacity.AgentKeyBytes || bytes.Equal(key2, key1) || gen != float64(2) {
		t.Fatalf("owner change answered %s", r.Body)
	}
	refused = agents.Refused()
	third := reclaim(keyManager, "gpu-5")
	completed(third, "vm-spot-4")
	if agents.Refused() == refused {
		t.Error("the agent without the new key refused nothing: the service did not sign with generation 2")
	}
	// The key handed out is stored only sealed.
	n, err := store.GetNode(ctx, node)
	if err != nil || n.AgentKeyGen != 2 || bytes.Contains(n.AgentKey, key2) || !slices.Equal(n.UnitIDs, demo.Seed(time.Now()).Nodes[0].UnitIDs) {
		t.Fatalf("stored node %+v, %v", n, err)
	}
	// terminate-node opened generation 2 with KMS and stored it resealed, where its own node
	// reads find it (the api's leave it out).
	own := *store
	own.ReadResealedAgentKeys = true
	st, err := own.LoadNode(ctx, node, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.Node.ResealedAgentKey; r == nil || r.Gen != 2 || bytes.Contains(r.Sealed, key2) {
		t.Fatalf("resealed agent key %+v, want generation 2's", r)
	}
}
