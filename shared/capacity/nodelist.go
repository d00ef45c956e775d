package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// NodeDirectory reads the state table's list index (shared/dynamo): the directory of every
// node, each org's candidate nodes, and each reservation's reclaim operations. The index is
// eventually consistent and written beside the items it points to, so its entries are
// candidates the service checks against the items themselves before it shows anything.
type NodeDirectory interface {
	// DirectoryNodes returns up to limit nodes in id order after afterID ("" from the first;
	// it need not exist), and whether more follow.
	DirectoryNodes(ctx context.Context, afterID string, limit int) ([]Node, bool, error)
	// MemberNodeIDs returns up to limit ids, in id order after afterID, of the nodes on which
	// org was named the owner or in a reservation's allowed or managing orgs (it may no longer
	// be: the caller checks), and whether more follow.
	MemberNodeIDs(ctx context.Context, orgID, afterID string, limit int) ([]string, bool, error)
	// NamedOn reports whether org was ever named on the node (the entry MemberNodeIDs lists),
	// with one small read that costs the same whether the node exists or not. False means the
	// org sees nothing there. ids, when not nil, are in id order the reservations of the node
	// that name the org (OperatorCommit.OrgReservations; some may name it no longer or not
	// exist: the caller checks); nil when the entry does not list them (written before it did).
	NamedOn(ctx context.Context, nodeID, orgID string) (named bool, ids []string, err error)
	// GetReservations reads the node's reservations of ids with strongly consistent reads, in
	// the order of ids, leaving out those that do not exist.
	GetReservations(ctx context.Context, nodeID string, ids []string) ([]Reservation, error)
	// ReservationOperations returns up to limit reclaim operations of the reservation, newest
	// first (by CreatedAt, then id), strictly after the position before (nil: from the
	// newest), in one of states (none: any), with their outcomes, and whether more follow.
	ReservationOperations(ctx context.Context, nodeID, reservationID string, states []OperationState,
		before *OperationPosition, limit int) ([]Operation, bool, error)
}

// OperationPosition places a reclaim operation in its reservation's list: by its creation,
// then its id.
type OperationPosition struct {
	CreatedAt time.Time
	ID        string
}

// NodeListing is a node as GET /v1/nodes shows it. OwnerOrgID is "" to a caller who may not
// see it (anyone but an operator and the owner).
type NodeListing struct {
	ID          string
	OwnerOrgID  string
	UnitIDs     []string
	TopologyGen int64
}

// NodePage is one page of the nodes a caller may see.
type NodePage struct {
	Nodes      []NodeListing
	NextCursor string
}

// seesAllNodes reports whether the caller sees every node and every unit: an operator holding
// node.manage, reservation.read or audit.read, or reservation.capacity (with which it may
// already read and reclaim every reservation of every node).
func seesAllNodes(p Principal) bool {
	return p.CanOperate(PermNodeManage) || p.CanOperate(PermRead) || p.CanOperate(PermAuditRead) || p.CanOperate(PermCapacity)
}

// readsTenantNodes reports whether a caller who does not see every node may see the ones its
// org owns or holds a reservation on: it holds reservation.read or reservation.capacity.
func readsTenantNodes(p Principal) bool { return p.Can(PermRead) || p.Can(PermCapacity) }

// nodeVisibleTo reports whether a tenant caller sees the node: its org owns it, or is in one
// of its reservations' allowed or managing orgs (whatever the reservation's status, as the
// reservation list shows them).
func nodeVisibleTo(p Principal, st *NodeState) bool {
	if st.Node.OwnerOrgID == p.OrgID {
		return true
	}
	for _, r := range st.Reservations {
		if slices.Contains(r.AllowedOrgIDs, p.OrgID) || slices.Contains(r.ManagingOrgIDs, p.OrgID) {
			return true
		}
	}
	return false
}

// AdmitNodeList is GET /v1/nodes' first gate, before its query is read: a caller who may see
// no node at all (no read permission) gets the list's 404.
func AdmitNodeList(p Principal) error {
	if !seesAllNodes(p) && !readsTenantNodes(p) {
		return Errorf(CodeNotFound, "not found")
	}
	return nil
}

// ListNodes returns a page of the nodes the caller may see, in id order: every node to an
// operator with node.manage, reservation.read, audit.read or reservation.capacity; to another caller with
// reservation.read or reservation.capacity, the nodes its org owns or holds a reservation on
// (candidates from the index, each checked on the node's own items, read on until the page is
// full). The owner org is shown to operators and to the owner only. The cursor names the last
// node shown.
func (s *Service) ListNodes(ctx context.Context, p Principal, page PageRequest) (*NodePage, error) {
	if err := AdmitNodeList(p); err != nil {
		return nil, err
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	after := ""
	if parts, err := parseCursor(page.Cursor, "nodes", 1); err != nil {
		return nil, err
	} else if parts != nil {
		if !ValidID(parts[0]) {
			return nil, Errorf(CodeInvalidRequest, "invalid cursor")
		}
		after = parts[0]
	}
	dir, ok := s.Store.(NodeDirectory)
	if !ok {
		return nil, fmt.Errorf("store %T does not implement the node directory", s.Store)
	}
	start := time.Now()
	var nodes []NodeListing
	var more bool
	if seesAllNodes(p) {
		var ns []Node
		ns, more, err = dir.DirectoryNodes(ctx, after, limit)
		for _, n := range ns {
			nodes = append(nodes, NodeListing{ID: n.ID, OwnerOrgID: n.OwnerOrgID, UnitIDs: n.UnitIDs, TopologyGen: n.TopologyGen})
		}
	} else {
		nodes, more, err = s.memberNodes(ctx, dir, p, after, limit)
	}
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if err != nil {
		if e := (*Error)(nil); errors.As(err, &e) {
			return nil, err
		}
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := &NodePage{Nodes: nodes}
	if out.Nodes == nil {
		out.Nodes = []NodeListing{}
	}
	if more && len(nodes) > 0 {
		out.NextCursor = listCursor("nodes", nodes[len(nodes)-1].ID)
	}
	return out, nil
}

// memberNodes reads the org's candidate nodes after afterID and keeps those the caller still
// sees (a former owner no longer does), until it has limit of them and knows whether another
// follows. Each candidate's partition is read strongly consistent: the index may lag, the
// node's items do not.
func (s *Service) memberNodes(ctx context.Context, dir NodeDirectory, p Principal, afterID string, limit int) ([]NodeListing, bool, error) {
	out := []NodeListing{}
	for {
		ids, more, err := dir.MemberNodeIDs(ctx, p.OrgID, afterID, limit+1)
		if err != nil {
			return nil, false, err
		}
		for _, id := range ids {
			st, err := s.Store.LoadNode(ctx, id, "")
			if ErrorCode(err) == CodeNotFound {
				continue
			}
			if err != nil {
				return nil, false, fmt.Errorf("load node %s: %w", id, err)
			}
			if !nodeVisibleTo(p, st) {
				continue
			}
			if len(out) == limit {
				return out, true, nil
			}
			out = append(out, listingFor(p, st.Node))
		}
		if !more || len(ids) == 0 {
			return out, false, nil
		}
		afterID = ids[len(ids)-1]
	}
}

// listingFor is the node as the caller sees it in the list: its owner org to its owner (or
// an operator) only.
func listingFor(p Principal, n Node) NodeListing {
	l := NodeListing{ID: n.ID, UnitIDs: n.UnitIDs, TopologyGen: n.TopologyGen}
	if p.Operator || n.OwnerOrgID == p.OrgID {
		l.OwnerOrgID = n.OwnerOrgID
	}
	return l
}
