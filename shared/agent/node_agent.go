package agent

import (
	"context"

	"github.com/openrelay/capacity/shared/capacity"
)

// NodeAgent is the domain's capacity.Agent over the client: each call is signed with the
// node's own key, opened as stored on the node (sealed under KMS, or derived from the master
// secret at generation 0), and the signed strings name the node.
type NodeAgent struct {
	Client *Client
	Opener Opener // opens a node's sealed keys
	Legacy Keys   // a generation-0 node's keys, derived from the master secret
	// Resealer, when set, opens a node's current generation from its resealed form (the
	// node's ResealedAgentKey, as LoadNode read it), with a KMS Decrypt only the first time.
	Resealer *Resealer
}

// Terminate terminates vmID on node through its agent; true when the agent no longer knew it.
func (a NodeAgent) Terminate(ctx context.Context, node capacity.Node, vmID string) (bool, error) {
	c := *a.Client // a shallow copy shares the connection pool
	c.Keys = a.keysOf(node)
	res, err := c.Terminate(ctx, node.AgentEndpoint, node.ID, vmID)
	return res.AlreadyGone, err
}

func (a NodeAgent) keysOf(n capacity.Node) Stored {
	return Stored{Opener: a.Opener, Legacy: a.Legacy, Gen: n.AgentKeyGen, Sealed: n.AgentKey,
		PrevSealed: n.PrevAgentKey, RotatedAt: n.AgentKeyRotatedAt, Overlap: capacity.AgentKeyOverlap,
		OverlapEnded: n.AgentKeyGen > 0 && n.AgentKeyOverlapEndedGen == n.AgentKeyGen,
		Resealer:     a.Resealer, Resealed: n.ResealedAgentKey}
}
