package capacity_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
)

// ---- steps ----

// reqUnits draws a non-empty set of distinct unit ids: mostly from pool, sometimes one
// that is not on any node.
func drawUnits(t *rapid.T, pool []string, label string) []string {
	if len(pool) == 0 || chance(t, 5, label+"Stray") {
		pool = append(slices.Clone(pool), "u99")
	}
	n := rapid.IntRange(1, min(3, len(pool))).Draw(t, label+"N")
	perm := rapid.Permutation(pool).Draw(t, label)
	return perm[:n]
}

// chance draws true pct percent of the time (rapid shrinks it to false: towards the common
// case, as rapid draws small numbers more often than large).
func chance(t *rapid.T, pct int, label string) bool {
	return rapid.IntRange(0, 99).Draw(t, label) >= 100-pct
}

func (m *model) drawReservation(t *rapid.T, node string) string {
	rs := m.reservations(node)
	if len(rs) == 0 || chance(t, 5, "noRes") {
		return "r-none"
	}
	// Those that may move capacity now first: rapid draws the first ones most often.
	slices.SortStableFunc(rs, func(a, b *mRes) int {
		return cmpBool(a.status == capacity.StatusActive && inTerm(a, m.clock), b.status == capacity.StatusActive && inTerm(b, m.clock))
	})
	return rapid.SampledFrom(rs).Draw(t, "res").id
}

// cmpBool orders true before false.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// drawKey draws an Idempotency-Key: none, a fresh one, or one used before (a reuse).
func (m *model) drawKey(t *rapid.T) string {
	switch rapid.IntRange(0, 9).Draw(t, "keyKind") {
	case 7, 8:
		return m.newID("key-")
	case 9:
		if len(m.calls) > 0 {
			return rapid.SampledFrom(m.calls).Draw(t, "reusedKey").cap.IdempotencyKey
		}
	}
	return ""
}

func (m *model) stepCapacity(t *rapid.T, action string) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	resID := m.drawReservation(t, node)
	pool := m.nodes[node].units
	if r := m.res[node+"/"+resID]; r != nil && !chance(t, 20, "fromNode") {
		pool = r.units
	}
	req := capacity.CapacityRequest{NodeID: node, ReservationID: resID, UnitIDs: drawUnits(t, pool, "units")}
	req.DryRun = chance(t, 25, "dryRun")
	p := rapid.SampledFrom(mCallers).Draw(t, "caller")
	meta := capacity.RequestMeta{RequestID: m.newID("req-")}
	if action == capacity.ActionReclaim {
		req.GraceSeconds = rapid.SampledFrom([]int{0, 0, 0, 0, 30, 120, capacity.MaxGraceSeconds + 1}).Draw(t, "grace")
		switch rapid.IntRange(0, 9).Draw(t, "ifMatch") {
		case 9:
			req.IfMatch = "*"
		case 6, 7, 8:
			if len(m.etags) > 0 {
				req.IfMatch = rapid.SampledFrom(slices.Sorted(maps.Keys(m.etags))).Draw(t, "etag")
			}
		case 5:
			req.IfMatch = `"0123456789abcdef0123456789abcdef"`
		}
	}
	if chance(t, 15, "viaEvent") && action == capacity.ActionReclaim {
		// A reclaim requested on the bus: it acts as its source, keyed by the event's id.
		p = mSource
		meta.Via, meta.EventID = capacity.ViaEvent, m.newID("ev-")
		req.IdempotencyKey = capacity.EventKeyPrefix + meta.EventID
		req.IfMatch = ""
	} else {
		req.IdempotencyKey = m.drawKey(t)
	}
	call := mCall{kind: action, p: p, cap: req, meta: meta}
	if req.IdempotencyKey != "" {
		m.calls = append(m.calls, call)
	}
	m.step(action + dryLabel(req.DryRun))
	m.capacityCall(call)
}

func dryLabel(dry bool) string {
	if dry {
		return " (dry run)"
	}
	return ""
}

// capacityCall runs a reclaim or release and checks its answer against the model, which it
// then moves on.
func (m *model) capacityCall(c mCall) {
	var res *capacity.CapacityResult
	var err error
	if c.kind == capacity.ActionReclaim {
		res, err = m.svc.Reclaim(m.ctx, c.p, c.cap, c.meta)
	} else {
		res, err = m.svc.Release(m.ctx, c.p, c.cap, c.meta)
	}
	if m.transient(err) {
		return
	}
	m.expectCapacity(c, fmt.Sprintf("%s %+v by %s", c.kind, c.cap, c.p.KeyID), res, err)
}

// expectCapacity checks the answer to a reclaim or release (of a scheduled reclaim's firing
// too) against the model, which it then moves on; it returns what the model predicted: ""
// (applied), "replayed", or the error code.
func (m *model) expectCapacity(c mCall, what string, res *capacity.CapacityResult, err error) capacity.Code {
	req, p := c.cap, c.p
	m.touched[req.NodeID] = true
	if !slices.Contains(p.Permissions, capacity.PermCapacity) {
		return m.expectErr(what, err, capacity.CodeNotFound, nil)
	}
	// A client may not take the keys the service keys events and scheduled firings with.
	ownKey := strings.HasPrefix(req.IdempotencyKey, capacity.EventKeyPrefix) || strings.HasPrefix(req.IdempotencyKey, capacity.ScheduledKeyPrefix)
	ownKey = ownKey && !(c.meta.Via == capacity.ViaEvent && req.IdempotencyKey == capacity.EventKeyPrefix+c.meta.EventID)
	ownKey = ownKey && !(c.meta.Via == capacity.ViaSchedule && strings.HasPrefix(req.IdempotencyKey, capacity.ScheduledKeyPrefix))
	if ownKey || req.GraceSeconds > capacity.MaxGraceSeconds || c.kind == capacity.ActionRelease && req.IfMatch != "" {
		return m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
	}
	if code := m.authorize(p, req.NodeID, req.ReservationID); code != "" {
		return m.expectErr(what, err, code, nil)
	}
	fp := fingerprint(c.kind, req)
	if code, ok := m.replay(what, req.NodeID, p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return code
	}
	pl := m.decideCapacity(c.kind, p, req)
	if pl.err == "" && c.kind == capacity.ActionReclaim && req.IfMatch != "" && !req.DryRun && !m.ifMatches(req.IfMatch, pl.etagKey) {
		pl.err = capacity.CodePlanChanged
	}
	if pl.err == "" && c.fire != nil && c.fire.state != capacity.ScheduledPending {
		pl.err = capacity.CodeScheduledReclaimFired // its record has expired: it fired before
	}
	if pl.err != "" {
		return m.expectErr(what, err, pl.err, pl.errUnits)
	}
	m.expectOK(what, err)
	r := m.res[req.NodeID+"/"+req.ReservationID]
	if !same(res.Reservation.ReleasedUnitIDs, pl.released) && !req.DryRun {
		m.mismatch("%s: released after %v, model %v", what, res.Reservation.ReleasedUnitIDs, pl.released)
	}
	if c.kind == capacity.ActionReclaim {
		if !slices.Equal(sorted(res.Terminated), pl.victims) || !slices.Equal(sorted(res.Skipped), pl.skipped) {
			m.mismatch("%s: terminated %v skipped %v, model %v %v", what, res.Terminated, res.Skipped, pl.victims, pl.skipped)
		}
		evicts := len(pl.victims) > 0 && !req.DryRun
		if (res.ReclaimID != "") != evicts {
			m.mismatch("%s: reclaimId %q, model evicts: %v", what, res.ReclaimID, evicts)
		}
		wantAfter := time.Time{}
		if evicts {
			wantAfter = m.clock.Add(time.Duration(req.GraceSeconds) * time.Second)
		}
		if !res.TerminateAfter.Equal(wantAfter) {
			m.mismatch("%s: terminateAfter %v, model %v", what, res.TerminateAfter, wantAfter)
		}
		if req.DryRun {
			if res.PlanETag == "" {
				m.mismatch("%s: dry run answered no planEtag", what)
			}
			if key, seen := m.etags[res.PlanETag]; seen && key != pl.etagKey {
				m.mismatch("%s: ETag %s names plan %s and %s", what, res.PlanETag, key, pl.etagKey)
			}
			m.etags[res.PlanETag] = pl.etagKey
		}
	}
	if req.DryRun {
		if res.Reservation.Version != r.version || !same(res.Reservation.ReleasedUnitIDs, r.released) {
			m.mismatch("%s: dry run answered the reservation at v%d %v, model v%d %v", what,
				res.Reservation.Version, res.Reservation.ReleasedUnitIDs, r.version, r.released)
		}
		return ""
	}
	if pl.changes {
		r.version++
		m.nodes[req.NodeID].version++
		r.released = pl.released
	}
	if res.Reservation.Version != r.version {
		m.mismatch("%s: reservation version %d, model %d", what, res.Reservation.Version, r.version)
	}
	if len(pl.victims) > 0 {
		op := &mOp{id: res.ReclaimID, node: req.NodeID, res: r.id, vms: pl.victims, state: capacity.OpPendingStart, attempt: 1,
			outcomes: map[string]mOutcome{}}
		if m.ops[op.id] != nil {
			m.mismatch("%s: reclaim id %s reused", what, op.id)
		}
		m.ops[op.id] = op
		m.dirty[op.id] = true
		for _, id := range pl.victims {
			vm := m.vms[req.NodeID+"/"+id]
			vm.state, vm.reclaim = capacity.VMTerminating, op.id
		}
		if last := m.wf.Last(); last != op.id {
			m.mismatch("%s: workflow started %q, want %q", what, last, op.id)
		}
	}
	m.remember(req.NodeID, p, req.IdempotencyKey, fp, res)
	return ""
}

func (m *model) stepPlace(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	vmID := m.newID("vm")
	if used := slices.Sorted(maps.Keys(n.usedVMs)); len(used) > 0 && chance(t, 10, "reuseVM") {
		vmID = rapid.SampledFrom(used).Draw(t, "vmID")
	}
	tier := rapid.SampledFrom([]capacity.Tier{capacity.TierSpot, capacity.TierSpot, capacity.TierReserved, capacity.TierOnDemand}).Draw(t, "tier")
	org := rapid.SampledFrom([]string{"aud", "buyer"}).Draw(t, "org")
	req := capacity.PlacementRequest{NodeID: node, VMID: vmID, OrgID: org, Tier: tier, UnitIDs: drawUnits(t, n.units, "units")}
	p := mPlacer
	if chance(t, 5, "placeNoPerm") {
		p = mOwnerA
	}
	if chance(t, 20, "placeKey") {
		req.IdempotencyKey = m.newID("key-")
		m.calls = append(m.calls, mCall{kind: capacity.ActionPlace, p: p, pl: req})
	}
	m.step("place " + string(tier))
	m.placeCall(p, req)
}

func (m *model) placeCall(p capacity.Principal, req capacity.PlacementRequest) {
	what := fmt.Sprintf("place %+v by %s", req, p.KeyID)
	m.touched[req.NodeID] = true
	res, err := m.svc.Place(m.ctx, p, req, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if !p.Operator || !slices.Contains(p.Permissions, capacity.PermPlace) {
		m.expectErr(what, err, capacity.CodeNotFound, nil)
		return
	}
	fp := fingerprint(capacity.ActionPlace, req)
	if _, ok := m.replay(what, req.NodeID, p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return
	}
	n := m.nodes[req.NodeID]
	live := m.liveVMs(req.NodeID)
	if unknown := minus(req.UnitIDs, n.units); len(unknown) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, unknown)
		return
	}
	if m.vms[req.NodeID+"/"+req.VMID] != nil {
		m.expectErr(what, err, capacity.CodeVMExists, nil)
		return
	}
	if busy := occupiedBy(live, req.UnitIDs); len(busy) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsInUse, busy)
		return
	}
	var unavailable []string
	for _, u := range req.UnitIDs {
		if !m.admits(req.NodeID, u, req.Tier, req.OrgID) {
			unavailable = append(unavailable, u)
		}
	}
	if len(unavailable) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsUnavailable, unavailable)
		return
	}
	if n.usedVMs[req.VMID] { // terminated: its id stays in the node's history
		m.expectErr(what, err, capacity.CodeVMExists, nil)
		return
	}
	m.expectOK(what, err)
	if res.VM.ID != req.VMID || res.VM.Tier != req.Tier || res.VM.State != capacity.VMRunning || !same(res.VM.UnitIDs, req.UnitIDs) {
		m.mismatch("%s: placed %+v", what, res.VM)
	}
	n.usedVMs[req.VMID] = true
	n.version++
	m.vms[req.NodeID+"/"+req.VMID] = &mVM{id: req.VMID, node: req.NodeID, org: req.OrgID, tier: req.Tier,
		units: sorted(req.UnitIDs), state: capacity.VMRunning}
	m.remember(req.NodeID, p, req.IdempotencyKey, fp, res)
}

// admits is the placement rule of docs/api.md for one unit: held by one reservation (active or
// pending in its term; needs-review until it ends), a unit takes a spot VM if released by
// an active reservation in term at the node's generation, a reserved VM of its audience if
// exclusive to one; held by none, spot or on-demand, but only spot while a reservation is
// still to start on it; held by two, nothing.
func (m *model) admits(node, unit string, tier capacity.Tier, org string) bool {
	var holders []*mRes
	upcoming := false
	for _, r := range m.reservations(node) {
		if !slices.Contains(r.units, unit) {
			continue
		}
		switch r.status {
		case capacity.StatusNeedsReview:
			if !ended(r, m.clock) {
				holders = append(holders, r)
			}
		case capacity.StatusActive, capacity.StatusPending:
			if inTerm(r, m.clock) {
				holders = append(holders, r)
			} else if m.clock.Before(r.start) {
				upcoming = true
			}
		}
	}
	switch len(holders) {
	case 0:
		return tier == capacity.TierSpot || tier == capacity.TierOnDemand && !upcoming
	case 1:
	default:
		return false
	}
	r := holders[0]
	grants := r.status == capacity.StatusActive && r.gen == m.nodes[node].gen
	released := slices.Contains(r.released, unit)
	switch tier {
	case capacity.TierSpot:
		return grants && released
	case capacity.TierReserved:
		return grants && !released && slices.Contains(r.allowed, org)
	}
	return false
}

// stepDuplicate delivers a call made under an Idempotency-Key (or an event) again.
func (m *model) stepDuplicate(t *rapid.T) {
	if len(m.calls) == 0 {
		return
	}
	c := rapid.SampledFrom(m.calls).Draw(t, "call")
	m.step("duplicate " + c.kind)
	c.meta.RequestID = m.newID("req-")
	switch c.kind {
	case capacity.ActionPlace:
		m.placeCall(c.p, c.pl)
	case capacity.ActionTopologySet:
		m.topologyCall(c)
	default:
		m.capacityCall(c)
	}
}
