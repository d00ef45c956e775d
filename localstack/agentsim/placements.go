package agentsim

import (
	"context"

	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
)

// NodeLoader reads a node as the service stores it (*dynamo.Store is one).
type NodeLoader interface {
	LoadNode(ctx context.Context, nodeID, idempotencyScope string) (*capacity.NodeState, error)
}

// LearnPlacements makes the simulated nodes run every VM the API placed on them, as a real
// node starts the VMs the marketplace places: when a call names a VM the node does not know
// (terminate, status, notice, the admin API, or State), the simulator reads the node from the state
// table and takes each VM it does not know yet in the state the node would have it in:
// terminated once the table says so, running otherwise (a VM being terminated still runs
// until its agent is told). A VM the simulator knows keeps its own state: the table does not
// overrule the node. Without it, a VM placed through POST /v1/nodes/{nodeId}/vms was unknown
// to its agent and its reclaim ended "already-gone". Reading the table, rather than taking
// any unknown VM id as running, keeps the simulator's 404 for a VM nobody placed.
func (s *Sim) LearnPlacements(l NodeLoader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.placements = l
}

// learnIfUnknown learns node's placements (learn) when the node does not know vmID.
func (s *Sim) learnIfUnknown(ctx context.Context, nodeID, vmID string) {
	if s.state(nodeID, vmID) == agent.StateUnknown {
		s.learn(ctx, nodeID)
	}
}

// learn takes the VMs the state table has on node and the simulator does not know yet.
func (s *Sim) learn(ctx context.Context, nodeID string) {
	s.mu.Lock()
	l := s.placements
	s.mu.Unlock()
	if l == nil || !validNodeID(nodeID) {
		return
	}
	st, err := l.LoadNode(ctx, nodeID, "")
	if err != nil {
		if capacity.ErrorCode(err) != capacity.CodeNotFound {
			s.logger.Warn("cannot read the node's placements", "node", nodeID, "error", err.Error())
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, vm := range st.VMs {
		if !agent.ValidVMID(vm.ID) {
			continue
		}
		if v := s.vm(nodeID, vm.ID); v.state == "" {
			v.state = agent.StateRunning
			if vm.State == capacity.VMTerminated {
				v.state = agent.StateTerminated
			}
			s.logger.Info("learned a VM the API placed", "node", nodeID, "vmId", vm.ID, "state", v.state)
		}
	}
}
