package agentsim

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
)

// table is a state table of nodes, as LoadNode answers it.
type table map[string][]capacity.VM

func (tb table) LoadNode(_ context.Context, nodeID, _ string) (*capacity.NodeState, error) {
	vms, ok := tb[nodeID]
	if !ok {
		return nil, capacity.Errorf(capacity.CodeNotFound, "no node %s", nodeID)
	}
	return &capacity.NodeState{Node: capacity.Node{ID: nodeID}, VMs: vms}, nil
}

// TestLearnPlacements: a VM the API placed (in the state table, not given to the simulator) is
// run by its node: terminated by a terminate call; the table does not overrule what the node
// knows, and a VM nobody placed stays unknown.
func TestLearnPlacements(t *testing.T) {
	placed := table{"node-a": {
		{ID: "vm-placed", State: capacity.VMRunning},
		{ID: "vm-reclaimed", State: capacity.VMTerminating},
		{ID: "vm-ended", State: capacity.VMTerminated},
		{ID: "vm-known", State: capacity.VMRunning},
	}}
	tests := []struct {
		name    string
		learn   bool
		node    string
		vm      string
		want    outcome
		stateAt string // the node's state of the VM after the call
	}{
		{"placed through the API: terminated", true, "node-a", "vm-placed", terminated, agent.StateTerminated},
		{"being reclaimed: still runs until told", true, "node-a", "vm-reclaimed", terminated, agent.StateTerminated},
		{"ended in the table: already gone", true, "node-a", "vm-ended", gone, agent.StateTerminated},
		{"known to the node: the node's state wins", true, "node-a", "vm-known", gone, agent.StateTerminated},
		{"placed by nobody: unknown", true, "node-a", "vm-nobody", gone, agent.StateUnknown},
		{"a node the table lacks: unknown", true, "node-b", "vm-placed", gone, agent.StateUnknown},
		{"without LearnPlacements: unknown", false, "node-a", "vm-placed", gone, agent.StateUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := start(t)
			mustAdd(t, s, "node-a", "vm-known", agent.StateTerminated)
			if tt.learn {
				s.LearnPlacements(placed)
			}
			if got := outcomeOf(c.Terminate(context.Background(), s.Endpoint(tt.node), tt.node, tt.vm)); got != tt.want {
				t.Errorf("terminate: outcome %v, want %v", got, tt.want)
			}
			if got := s.State(tt.node, tt.vm); got != tt.stateAt {
				t.Errorf("state after = %s, want %s", got, tt.stateAt)
			}
		})
	}
}

// TestStateLearnsPlacements: State reads the node as its calls do, so a placed VM is running
// before any call names it.
func TestStateLearnsPlacements(t *testing.T) {
	s, _ := start(t)
	s.LearnPlacements(table{"node-a": {{ID: "vm-placed", State: capacity.VMRunning}}})
	if got := s.State("node-a", "vm-placed"); got != agent.StateRunning {
		t.Errorf("State = %s, want running", got)
	}
}
