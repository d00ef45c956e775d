package capacity

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// ReclaimPlanRequest asks which units a reclaim of Count units of a reservation should take.
type ReclaimPlanRequest struct {
	NodeID        string
	ReservationID string
	Count         int
	Reason        string
	GraceSeconds  int
}

// ReclaimPlan answers a ReclaimPlanRequest: the released units to take back from the spot
// market, ranked by least disruption, the units already exclusive (AlreadyYours: not part of
// the count, not in the reclaim), and the dry run of a reclaim of exactly UnitIDs (its
// PlanETag admits that reclaim).
type ReclaimPlan struct {
	Count        int
	UnitIDs      []string
	AlreadyYours []string
	CapacityResult
}

// reclaim is the reclaim of units the plan stands for, as a dry run.
func (r ReclaimPlanRequest) reclaim(units []string) CapacityRequest {
	return CapacityRequest{
		NodeID: r.NodeID, ReservationID: r.ReservationID, UnitIDs: units, DryRun: true,
		Reason: r.Reason, GraceSeconds: r.GraceSeconds,
	}
}

// admit is the reclaim's admission (admitFor) with a count in place of the unit list.
func (r ReclaimPlanRequest) admit(p Principal) error {
	if err := AdmitCapacityCall(p, r.NodeID, r.ReservationID); err != nil {
		return err
	}
	if r.Count < 1 || r.Count > MaxUnits {
		return Errorf(CodeInvalidRequest, "count must be 1 to %d", MaxUnits)
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return validateGrace(r.GraceSeconds)
}

// PlanReclaim answers which units a reclaim of req.Count units should take and what that
// reclaim would do. It changes nothing; it is audited as the dry run of that reclaim.
func (s *Service) PlanReclaim(ctx context.Context, p Principal, req ReclaimPlanRequest, meta RequestMeta) (*ReclaimPlan, error) {
	res, err := s.planReclaim(ctx, p, req, meta)
	c := CallOutcome{Action: ActionReclaim, RequestID: meta.RequestID, DryRun: true}
	s.recordCall(ctx, c, err)
	return res, err
}

func (s *Service) planReclaim(ctx context.Context, p Principal, req ReclaimPlanRequest, meta RequestMeta) (*ReclaimPlan, error) {
	if err := req.admit(p); err != nil {
		return nil, err
	}
	st, err := s.Store.LoadNode(ctx, req.NodeID, "")
	if ErrorCode(err) == CodeNotFound {
		return nil, notFound()
	}
	if err != nil {
		return nil, fmt.Errorf("load node %s: %w", req.NodeID, err)
	}
	now := s.now()
	units, plan, err := DecideReclaimPlan(p, st, req, now)
	audit := s.auditRecord(p, st, req.reclaim(units), meta, ActionReclaim, now)
	if err != nil {
		s.auditRefusal(ctx, audit, err)
		return nil, err
	}
	_, result, audit := plan.Commit("", audit, now)
	start := time.Now()
	s.append(ctx, audit)
	CallStatsFrom(ctx).Since(PhaseCommit, start)
	yours := exclusiveUnits(st.Reservation(req.ReservationID))
	return &ReclaimPlan{Count: req.Count, UnitIDs: units, AlreadyYours: yours, CapacityResult: result}, nil
}

// DecideReclaimPlan ranks the reservation's released units (rankReclaim) and decides the dry
// run of a reclaim of the first Count of them, after the reclaim's own checks
// (checkCapacityCall). A count beyond what the reservation can take back from the spot market
// is refused with how many it can.
func DecideReclaimPlan(p Principal, st *NodeState, req ReclaimPlanRequest, now time.Time) ([]string, *CapacityPlan, error) {
	r, err := checkCapacityCall(p, st, req.reclaim(nil), now)
	if err != nil {
		return nil, nil, err
	}
	units, available := rankReclaim(st, r, req.Count, now)
	if units == nil {
		return nil, nil, &Error{Code: CodeInsufficientUnits, Available: &available,
			Message: fmt.Sprintf("the reservation has %d released units a reclaim can take back; %d asked", available, req.Count)}
	}
	plan, err := DecideReclaim(p, st, req.reclaim(units), now)
	if err != nil {
		return nil, nil, fmt.Errorf("decide the planned reclaim: %w", err)
	}
	return units, plan, nil
}

// evictionCandidate is a running spot VM and the reservation's units it stands on.
type evictionCandidate struct {
	vm    VM
	units []string // the reservation's units under the VM, sorted
	cost  evictionCost
}

// evictionCost is what evicting a set of VMs costs, compared in field order: the VMs
// terminated, then the units they stand on (all of them, in or out of the reservation: a
// VM that spans units the reclaim does not need loses them too), then their summed age
// (the work lost since they started).
type evictionCost struct {
	vms, units int
	age        time.Duration
}

func (a evictionCost) plus(b evictionCost) evictionCost {
	return evictionCost{vms: a.vms + b.vms, units: a.units + b.units, age: a.age + b.age}
}

func (a evictionCost) compare(b evictionCost) int {
	return cmp.Or(cmp.Compare(a.vms, b.vms), cmp.Compare(a.units, b.units), cmp.Compare(a.age, b.age))
}

// rankReclaim chooses count of the reservation's released units, the ones a reclaim takes back
// from the spot market, least disruptive first: released idle units, units whose spot VM is
// already being terminated (each in unit id order), then units of running spot VMs, chosen
// as a set (chooseEvictions). A unit already exclusive is never chosen (taking it changes
// nothing, so it cannot make up the count), nor one under a VM of another tier. It answers
// nil and how many units could be chosen when count is more than that.
func rankReclaim(st *NodeState, r *Reservation, count int, now time.Time) ([]string, int) {
	holder := map[string]VM{}
	for _, vm := range st.VMs {
		if vm.occupies() {
			for _, u := range vm.UnitIDs {
				holder[u] = vm
			}
		}
	}
	var idle, ending []string
	byVM := map[string]*evictionCandidate{}
	var candidates []*evictionCandidate
	available := 0
	for _, u := range slices.Sorted(slices.Values(r.ReleasedUnitIDs)) {
		if !slices.Contains(r.ReservedUnitIDs, u) {
			continue
		}
		vm, held := holder[u]
		switch {
		case !held:
			idle = append(idle, u)
		case vm.Tier != TierSpot:
			continue
		case vm.State != VMRunning:
			ending = append(ending, u)
		default:
			c := byVM[vm.ID]
			if c == nil {
				c = &evictionCandidate{vm: vm, cost: evictionCost{vms: 1, units: len(vm.UnitIDs), age: max(now.Sub(vm.CreatedAt), 0)}}
				byVM[vm.ID] = c
				candidates = append(candidates, c)
			}
			c.units = append(c.units, u)
		}
		available++
	}
	if count > available {
		return nil, available
	}
	ranked := slices.Concat(idle, ending)
	if count <= len(ranked) {
		return ranked[:count], available
	}
	for _, c := range chooseEvictions(candidates, count-len(ranked)) {
		ranked = append(ranked, c.units...)
	}
	return ranked[:count], available
}

// exclusiveUnits are r's units already exclusive (reserved, not released), sorted: a plan
// names them as already the reservation's and never counts them.
func exclusiveUnits(r *Reservation) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, u := range slices.Sorted(slices.Values(r.ReservedUnitIDs)) {
		if !slices.Contains(r.ReleasedUnitIDs, u) {
			out = append(out, u)
		}
	}
	return out
}

// chooseEvictions answers the VMs whose units give at least need units at the least
// evictionCost, exactly: a table over (candidate, units still needed), O(VMs × need), at
// most 64 × 64 entries (MaxUnits). Candidates are taken in order of their own cost, then
// first unit id, and at equal cost an earlier one is chosen over a later one, so the answer
// is one for a state; it lists the chosen VMs in that order.
func chooseEvictions(candidates []*evictionCandidate, need int) []*evictionCandidate {
	candidates = slices.Clone(candidates)
	slices.SortFunc(candidates, func(a, b *evictionCandidate) int {
		return cmp.Or(a.cost.compare(b.cost), cmp.Compare(a.units[0], b.units[0]))
	})
	m := len(candidates)
	// best[j][k]: the least cost of taking at least k units from candidates[j:] (ok false: none can).
	type entry struct {
		cost evictionCost
		ok   bool
	}
	best := make([][]entry, m+1)
	for j := range best {
		best[j] = make([]entry, need+1)
	}
	best[m][0].ok = true
	with := func(j, k int) entry {
		rest := best[j+1][max(k-len(candidates[j].units), 0)]
		return entry{cost: candidates[j].cost.plus(rest.cost), ok: rest.ok}
	}
	for j := m - 1; j >= 0; j-- {
		for k := 0; k <= need; k++ {
			e := best[j+1][k]
			if w := with(j, k); w.ok && (!e.ok || w.cost.compare(e.cost) < 0) {
				e = w
			}
			best[j][k] = e
		}
	}
	var chosen []*evictionCandidate
	for j, k := 0, need; j < m && k > 0; j++ {
		if w := with(j, k); w.ok && w.cost == best[j][k].cost {
			chosen = append(chosen, candidates[j])
			k = max(k-len(candidates[j].units), 0)
		}
	}
	return chosen
}
