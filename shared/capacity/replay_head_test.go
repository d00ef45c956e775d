package capacity_test

import (
	"context"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// A retry of a node put or a topology change under its Idempotency-Key (a redelivered Node
// Topology Changed event is one) answers what the call answered, the node's auditHead
// included: the head of the change's own record, which the node still has. The stored answer
// used to carry the head before the change.
func TestReplayAnswersTheAuditHeadOfTheChange(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(*capacity.Service) (capacity.Node, bool, error)
	}{
		{"topology change", func(svc *capacity.Service) (capacity.Node, bool, error) {
			res, err := svc.SetTopology(context.Background(), mOperator, capacity.TopologyRequest{
				NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2"}, IdempotencyKey: "k1"}, capacity.RequestMeta{})
			if err != nil {
				return capacity.Node{}, false, err
			}
			return res.Node, res.Replayed, nil
		}},
		{"owner change", func(svc *capacity.Service) (capacity.Node, bool, error) {
			res, err := svc.PutNode(context.Background(), mOperator, capacity.NodeRequest{
				NodeID: "n1", OwnerOrgID: "own-b", AgentEndpoint: "https://agent.n1.example", UnitIDs: []string{"u0", "u1"},
				IdempotencyKey: "k1"}, capacity.RequestMeta{})
			if err != nil {
				return capacity.Node{}, false, err
			}
			return res.Node, res.Replayed, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := dynamotest.New(t)
			svc := &capacity.Service{Store: env.Store, Logger: quiet}
			_, err := svc.PutNode(context.Background(), mOperator, capacity.NodeRequest{
				NodeID: "n1", OwnerOrgID: "own-a", AgentEndpoint: "https://agent.n1.example", UnitIDs: []string{"u0", "u1"},
			}, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			first, _, err := tc.call(svc)
			if err != nil {
				t.Fatal(err)
			}
			again, replayed, err := tc.call(svc)
			if err != nil || !replayed {
				t.Fatalf("retry: replayed %v, err %v", replayed, err)
			}
			now, err := svc.GetNode(context.Background(), mOperator, "n1")
			if err != nil {
				t.Fatal(err)
			}
			if first.AuditHead != now.AuditHead {
				t.Errorf("the change answered head %+v; the node's is %+v", first.AuditHead, now.AuditHead)
			}
			if again.AuditHead != first.AuditHead || again.Version != first.Version {
				t.Errorf("the retry answered head %+v (v%d); the change answered %+v (v%d)", again.AuditHead, again.Version,
					first.AuditHead, first.Version)
			}
		})
	}
}
