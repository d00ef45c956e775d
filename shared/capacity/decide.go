package capacity

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Access is what the caller may do with a reservation.
type Access int

const (
	AccessNone   Access = iota // may not know it exists
	AccessView                 // audience: may see it, not move its capacity
	AccessManage               // operator, node owner, or managing org
)

// AccessOf returns the caller's access to a reservation on a node, by role alone.
func AccessOf(p Principal, n Node, r Reservation) Access {
	switch {
	case p.Operator, p.OrgID == n.OwnerOrgID, slices.Contains(r.ManagingOrgIDs, p.OrgID):
		return AccessManage
	case slices.Contains(r.AllowedOrgIDs, p.OrgID):
		return AccessView
	}
	return AccessNone
}

// checkCapacityCall applies the checks of a reclaim or release in the documented order:
// permission (404), reservation on that node (404), role (404, or 403 for the audience),
// state preconditions (409), units against the reservation (422). It returns the reservation.
func checkCapacityCall(p Principal, st *NodeState, req CapacityRequest, now time.Time) (*Reservation, error) {
	r, err := authorizeCapacityCall(p, st, req.ReservationID)
	if err != nil {
		return nil, err
	}
	if r.Status != StatusActive {
		return nil, Errorf(CodeReservationNotActive, "reservation is %s, not active", r.Status)
	}
	if !r.InTerm(now) {
		return nil, Errorf(CodeOutsideTerm, "reservation is outside its term")
	}
	if st.Node.TopologyGen != r.TopologyGen {
		return nil, Errorf(CodeTopologyChanged, "node topology generation is %d; the reservation was written against %d",
			st.Node.TopologyGen, r.TopologyGen)
	}
	if bad := notReserved(r, req.UnitIDs); len(bad) > 0 {
		return nil, &Error{Code: CodeUnitsNotReserved, Message: "units are not reserved by this reservation", UnitIDs: bad}
	}
	return r, nil
}

// authorizeCapacityCall is the part of checkCapacityCall that depends on who calls, not on
// the reservation's state: permission (404), reservation on that node (404), role (404, or
// 403 for the audience). It also guards idempotent replays, so a caller who has lost access
// never gets a stored answer.
func authorizeCapacityCall(p Principal, st *NodeState, reservationID string) (*Reservation, error) {
	if !p.Can(PermCapacity) {
		return nil, notFound()
	}
	r := st.Reservation(reservationID)
	if r == nil {
		return nil, notFound()
	}
	switch AccessOf(p, st.Node, *r) {
	case AccessNone:
		return nil, notFound()
	case AccessView:
		return nil, Errorf(CodeForbidden, "only a platform operator, the node owner or a managing org may move this reservation's capacity")
	}
	return r, nil
}

// notReserved returns the ids not in the reservation's reserved units.
func notReserved(r *Reservation, ids []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(r.ReservedUnitIDs, id) {
			out = append(out, id)
		}
	}
	return out
}

// CapacityPlan is the decision of a reclaim or a release: what the reservation's released set
// becomes and which VMs go. Its Commit turns it into writes; nothing else needs to know which
// action made it.
type CapacityPlan struct {
	Action      string      // ActionReclaim or ActionRelease
	Node        Node        // as read: the commit conditions on its version
	Reservation Reservation // as read
	Released    []string    // releasedUnitIds after the call
	Victims     []VM        // running spot VMs on the reclaimed units, as read (reclaim only)
	Skipped     []VM        // running VMs of other tiers on the reclaimed units (reclaim only)
	// The request's own facts that the writes and the answer carry.
	UnitIDs []string
	DryRun  bool
	Reason  string
	Grace   time.Duration // delays the victims' termination (reclaim only)
}

// Changes reports whether the plan changes anything.
func (p *CapacityPlan) Changes() bool {
	return len(p.Victims) > 0 || len(p.Released) != len(p.Reservation.ReleasedUnitIDs)
}

// DecideCapacity decides a reclaim or a release (action ActionReclaim or ActionRelease).
func DecideCapacity(action string, p Principal, st *NodeState, req CapacityRequest, now time.Time) (*CapacityPlan, error) {
	switch action {
	case ActionReclaim:
		return DecideReclaim(p, st, req, now)
	case ActionRelease:
		return DecideRelease(p, st, req, now)
	}
	return nil, fmt.Errorf("decide capacity: unknown action %q", action)
}

// DecideReclaim decides a reclaim of units from the spot market back to the reservation's
// exclusive use. Units already exclusive are a no-op, so a retried reclaim succeeds and
// evicts nothing new. Every running spot VM on a named unit is evicted, whole, even if it
// also spans units not named; VMs of other tiers are left running and reported as skipped.
func DecideReclaim(p Principal, st *NodeState, req CapacityRequest, now time.Time) (*CapacityPlan, error) {
	r, err := checkCapacityCall(p, st, req, now)
	if err != nil {
		return nil, err
	}
	plan := newPlan(ActionReclaim, st, r, req)
	for _, u := range r.ReleasedUnitIDs {
		if !slices.Contains(req.UnitIDs, u) {
			plan.Released = append(plan.Released, u)
		}
	}
	plan.Released = nonNil(plan.Released)
	for _, vm := range st.VMs {
		if vm.State != VMRunning || !overlaps(vm.UnitIDs, req.UnitIDs) {
			continue
		}
		if vm.Tier == TierSpot {
			plan.Victims = append(plan.Victims, vm)
		} else {
			plan.Skipped = append(plan.Skipped, vm)
		}
	}
	sortVMs(plan.Victims)
	sortVMs(plan.Skipped)
	return plan, nil
}

// DecideRelease decides a release of exclusive units to the spot market ("double sell").
// Only idle units may be sold: a unit with a VM on it is refused. Units already released are
// a no-op.
func DecideRelease(p Principal, st *NodeState, req CapacityRequest, now time.Time) (*CapacityPlan, error) {
	r, err := checkCapacityCall(p, st, req, now)
	if err != nil {
		return nil, err
	}
	var newly []string
	for _, u := range req.UnitIDs {
		if !slices.Contains(r.ReleasedUnitIDs, u) {
			newly = append(newly, u)
		}
	}
	if busy := occupied(st.VMs, newly); len(busy) > 0 {
		return nil, &Error{Code: CodeUnitsInUse, Message: "units have a VM on them; only idle units can be released", UnitIDs: busy}
	}
	released := append(slices.Clone(r.ReleasedUnitIDs), newly...)
	sort.Strings(released)
	plan := newPlan(ActionRelease, st, r, req)
	plan.Released = nonNil(released)
	return plan, nil
}

func newPlan(action string, st *NodeState, r *Reservation, req CapacityRequest) *CapacityPlan {
	return &CapacityPlan{
		Action: action, Node: st.Node, Reservation: *r,
		UnitIDs: slices.Clone(req.UnitIDs), DryRun: req.DryRun, Reason: req.Reason,
		Grace: time.Duration(req.GraceSeconds) * time.Second,
	}
}

// Commit turns the plan into what the call writes and answers, with no I/O: the commit (nil
// for a dry run, which changes nothing), the caller's result, and the call's audit record
// (inside the commit when there is one; a dry run appends it on its own). audit carries the
// call's facts (ids, caller, time); opID names the reclaim operation if the plan evicts VMs.
func (p *CapacityPlan) Commit(opID string, audit AuditRecord, now time.Time) (*Commit, CapacityResult, AuditRecord) {
	result := CapacityResult{
		DryRun: p.DryRun, Reason: p.Reason, Reservation: p.Reservation,
		Terminated: VMIDs(p.Victims), Skipped: VMIDs(p.Skipped),
	}
	c := &Commit{Node: p.Node, BumpNode: p.Changes()}
	if c.BumpNode && !p.DryRun {
		after := p.Reservation
		after.ReleasedUnitIDs = p.Released
		after.UpdatedAt = now
		c.Reservation = &after
		result.Reservation = after
		result.Reservation.Version++ // as the store writes it
	}
	if len(p.Victims) > 0 && !p.DryRun {
		c.Evict = p.Victims
		c.Operation = &Operation{
			ID: opID, NodeID: p.Node.ID, ReservationID: p.Reservation.ID,
			State: OpPendingStart, VMIDs: result.Terminated, UnitIDs: p.UnitIDs,
			CreatedAt: now, UpdatedAt: now,
			// Who is told what: the notices and reports name each victim's buyer and the
			// owner as they were at commit.
			TerminateAfter: now.Add(p.Grace), OwnerOrgID: p.Node.OwnerOrgID, Victims: victims(p.Victims),
		}
		result.ReclaimID, result.TerminateAfter = opID, c.Operation.TerminateAfter
	}
	audit.ReleasedBefore = nonNil(p.Reservation.ReleasedUnitIDs)
	audit.ReleasedAfter = nonNil(result.Reservation.ReleasedUnitIDs)
	audit.Terminated, audit.Skipped, audit.ReclaimID = result.Terminated, result.Skipped, result.ReclaimID
	if len(p.Victims) > 0 {
		audit.Victims = victims(p.Victims)
	}
	audit.Outcome = "ok"
	if p.DryRun {
		if p.Action == ActionReclaim {
			result.PlanETag = p.ETag()
		}
		return nil, result, audit
	}
	c.Audit = audit
	return c, result, audit
}

// DecidePlacement decides whether a VM may be placed. Any VM needs free units. A spot VM may
// only land on units that are released by an active reservation or held by none; a reserved
// VM only on exclusive units of an active reservation whose audience includes its org; an
// on-demand VM only on units held by no reservation.
func DecidePlacement(p Principal, st *NodeState, req PlacementRequest, now time.Time) (*VM, error) {
	if err := AdmitPlacement(p, st.Node.ID); err != nil {
		return nil, err
	}
	var unknown []string
	for _, u := range req.UnitIDs {
		if !slices.Contains(st.Node.UnitIDs, u) {
			unknown = append(unknown, u)
		}
	}
	if len(unknown) > 0 {
		return nil, &Error{Code: CodeUnknownUnits, Message: "units do not exist on this node", UnitIDs: unknown}
	}
	for _, vm := range st.VMs {
		if vm.ID == req.VMID {
			return nil, Errorf(CodeVMExists, "VM %s already exists on this node", req.VMID)
		}
	}
	if busy := occupied(st.VMs, req.UnitIDs); len(busy) > 0 {
		return nil, &Error{Code: CodeUnitsInUse, Message: "units already have a VM on them", UnitIDs: busy}
	}
	var unavailable []string
	for _, u := range req.UnitIDs {
		if !unitAdmits(st, u, req.Tier, req.OrgID, now) {
			unavailable = append(unavailable, u)
		}
	}
	if len(unavailable) > 0 {
		return nil, &Error{Code: CodeUnitsUnavailable, Message: "units are not available at tier " + string(req.Tier) + " to this org", UnitIDs: unavailable}
	}
	return &VM{
		ID: req.VMID, NodeID: st.Node.ID, OrgID: req.OrgID, Tier: req.Tier,
		UnitIDs: slices.Sorted(slices.Values(req.UnitIDs)), State: VMRunning,
		CreatedAt: now, UpdatedAt: now,
	}, nil
}

// unitAdmits reports whether a unit may carry a VM of the tier for the org at t.
func unitAdmits(st *NodeState, unit string, tier Tier, org string, t time.Time) bool {
	var holders []Reservation
	upcoming := false
	for _, r := range st.Reservations {
		if !slices.Contains(r.ReservedUnitIDs, unit) {
			continue
		}
		if r.holds(t) {
			holders = append(holders, r)
		} else if r.upcoming(t) {
			upcoming = true
		}
	}
	if len(holders) == 0 {
		if upcoming {
			return tier == TierSpot // a reclaim evicts it when the reservation starts
		}
		return tier == TierSpot || tier == TierOnDemand
	}
	if len(holders) > 1 {
		return false // overlapping holds: nobody may use the unit until it is resolved
	}
	r := holders[0]
	grants := r.Status == StatusActive && r.InTerm(t) && r.TopologyGen == st.Node.TopologyGen
	released := slices.Contains(r.ReleasedUnitIDs, unit)
	switch tier {
	case TierSpot:
		return grants && released
	case TierReserved:
		return grants && !released && slices.Contains(r.AllowedOrgIDs, org)
	}
	return false
}

// occupied returns the units among ids that a running or terminating VM stands on.
func occupied(vms []VM, ids []string) []string {
	var out []string
	for _, id := range ids {
		for _, vm := range vms {
			if vm.occupies() && slices.Contains(vm.UnitIDs, id) {
				out = append(out, id)
				break
			}
		}
	}
	return out
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

func sortVMs(vms []VM) {
	slices.SortFunc(vms, func(a, b VM) int { return strings.Compare(a.ID, b.ID) })
}

// victims records the evicted VMs as they are at commit.
func victims(vms []VM) []Victim {
	out := make([]Victim, 0, len(vms))
	for _, vm := range vms {
		out = append(out, Victim{VMID: vm.ID, OrgID: vm.OrgID, UnitIDs: slices.Clone(vm.UnitIDs)})
	}
	return out
}

// VMIDs returns the ids of the VMs, in order.
func VMIDs(vms []VM) []string {
	out := make([]string, 0, len(vms))
	for _, vm := range vms {
		out = append(out, vm.ID)
	}
	return out
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
