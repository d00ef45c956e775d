package wire

import (
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// NodeListingJSON is a node as GET /v1/nodes shows it; ownerOrgId only to operators and the
// owner.
type NodeListingJSON struct {
	NodeID      string   `json:"nodeId"`
	OwnerOrgID  string   `json:"ownerOrgId,omitempty"`
	UnitIDs     []string `json:"unitIds"`
	TopologyGen int64    `json:"topologyGen"`
}

// NodePageJSON is a page of nodes, in id order; NextCursor is absent on the last page.
type NodePageJSON struct {
	Nodes      []NodeListingJSON `json:"nodes"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

// NodePage is p as the API shows it.
func NodePage(p *capacity.NodePage) NodePageJSON {
	out := NodePageJSON{Nodes: make([]NodeListingJSON, 0, len(p.Nodes)), NextCursor: p.NextCursor}
	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, NodeListingJSON{NodeID: n.ID, OwnerOrgID: n.OwnerOrgID, UnitIDs: list(n.UnitIDs), TopologyGen: n.TopologyGen})
	}
	return out
}

// UnitVMJSON is the VM on a unit: vmId and orgId only where the caller may see them.
type UnitVMJSON struct {
	VMID  string `json:"vmId,omitempty"`
	OrgID string `json:"orgId,omitempty"`
	Tier  string `json:"tier"`
	State string `json:"state"`
	// Since is when the VM entered its state (RFC 3339).
	Since string `json:"since"`
}

// UnitJSON is one unit of a node's unit view.
type UnitJSON struct {
	UnitID          string      `json:"unitId"`
	State           string      `json:"state"`
	ReservationID   string      `json:"reservationId,omitempty"`
	ReservationMode string      `json:"reservationMode,omitempty"`
	VM              *UnitVMJSON `json:"vm,omitempty"`
}

// UnitReservationJSON is a reservation of the unit view, with the caller's access to it.
type UnitReservationJSON struct {
	ID              string   `json:"id"`
	Status          string   `json:"status"`
	Access          string   `json:"access"`
	ReservedUnitIDs []string `json:"reservedUnitIds"`
	ReleasedUnitIDs []string `json:"releasedUnitIds"`
}

// NodeUnitsJSON answers GET /v1/nodes/{nodeId}/units.
type NodeUnitsJSON struct {
	NodeID       string                `json:"nodeId"`
	TopologyGen  int64                 `json:"topologyGen"`
	Version      int64                 `json:"version"`
	Units        []UnitJSON            `json:"units"`
	Reservations []UnitReservationJSON `json:"reservations"`
}

// Access names a caller's access as the unit view shows it.
func Access(a capacity.Access) string {
	if a == capacity.AccessManage {
		return "manage"
	}
	return "view"
}

// NodeUnits is v as the API shows it.
func NodeUnits(v *capacity.NodeUnits) NodeUnitsJSON {
	out := NodeUnitsJSON{NodeID: v.NodeID, TopologyGen: v.TopologyGen, Version: v.Version,
		Units: make([]UnitJSON, 0, len(v.Units)), Reservations: make([]UnitReservationJSON, 0, len(v.Reservations))}
	for _, u := range v.Units {
		j := UnitJSON{UnitID: u.UnitID, State: string(u.State), ReservationID: u.ReservationID, ReservationMode: u.ReservationMode}
		if vm := u.VM; vm != nil {
			j.VM = &UnitVMJSON{VMID: vm.ID, OrgID: vm.OrgID, Tier: string(vm.Tier), State: string(vm.State), Since: vm.Since.UTC().Format(time.RFC3339)}
		}
		out.Units = append(out.Units, j)
	}
	for _, r := range v.Reservations {
		out.Reservations = append(out.Reservations, UnitReservationJSON{ID: r.ID, Status: string(r.Status), Access: Access(r.Access),
			ReservedUnitIDs: list(r.ReservedUnitIDs), ReleasedUnitIDs: list(r.ReleasedUnitIDs)})
	}
	return out
}

// ReclaimPageJSON is a page of a reservation's reclaim operations, newest first, each as GET
// of the operation shows it; NextCursor is absent on the last page.
type ReclaimPageJSON struct {
	Reclaims   []OperationJSON `json:"reclaims"`
	NextCursor string          `json:"nextCursor,omitempty"`
}

// ReclaimPage is p as the API shows it.
func ReclaimPage(p *capacity.OperationPage) ReclaimPageJSON {
	out := ReclaimPageJSON{Reclaims: make([]OperationJSON, 0, len(p.Reclaims)), NextCursor: p.NextCursor}
	for i := range p.Reclaims {
		out.Reclaims = append(out.Reclaims, Operation(&p.Reclaims[i]))
	}
	return out
}
