package capacity_test

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
)

// stepCreate creates a reservation.
func (m *model) stepCreate(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	id := rapid.SampledFrom([]string{"r1", "r2", "r3", "r4", "r0"}).Draw(t, "resID")
	start := m.clock.Add(rapid.SampledFrom([]time.Duration{-2 * time.Hour, 0, time.Hour, 26 * time.Hour}).Draw(t, "startIn"))
	var end *time.Time
	if d := rapid.SampledFrom([]time.Duration{0, time.Hour, 25 * time.Hour, 72 * time.Hour}).Draw(t, "term"); d > 0 {
		end = ptr(start.Add(d))
	}
	status := rapid.SampledFrom([]capacity.Status{capacity.StatusActive, capacity.StatusActive, capacity.StatusPending}).Draw(t, "status")
	managing := []string{"mgr"}
	if chance(t, 25, "noManager") {
		managing = nil
	}
	req := capacity.ReservationRequest{NodeID: node, ID: id, Status: status, StartsAt: start, EndsAt: end,
		AllowedOrgIDs: []string{"aud"}, ManagingOrgIDs: managing, ReservedUnitIDs: drawUnits(t, n.units, "units")}
	m.step("create reservation")
	what := fmt.Sprintf("create %+v", req)
	res, err := m.svc.CreateReservation(m.ctx, mOperator, req, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if end != nil && !end.After(m.clock) {
		m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
		return
	}
	if m.res[node+"/"+id] != nil {
		m.expectErr(what, err, capacity.CodeReservationExists, nil)
		return
	}
	if unknown := minus(req.ReservedUnitIDs, n.units); len(unknown) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, unknown)
		return
	}
	nr := &mRes{id: id, node: node, units: req.ReservedUnitIDs, allowed: []string{"aud"}, managing: managing,
		status: status, start: start, end: end, gen: n.gen, version: 1}
	var overlap []string
	for _, o := range m.reservations(node) {
		s := statusAt(o, m.clock)
		claims := s == capacity.StatusActive || s == capacity.StatusPending || s == capacity.StatusNeedsReview
		termsMeet := (o.end == nil || nr.start.Before(*o.end)) && (nr.end == nil || o.start.Before(*nr.end))
		if claims && termsMeet {
			for _, u := range nr.units {
				if slices.Contains(o.units, u) && !slices.Contains(overlap, u) {
					overlap = append(overlap, u)
				}
			}
		}
	}
	if len(overlap) > 0 {
		m.expectErr(what, err, capacity.CodeReservationOverlap, overlap)
		return
	}
	var inUse []string
	released := []string{}
	for _, vm := range m.liveVMs(node) {
		for _, u := range vm.units {
			switch {
			case !slices.Contains(nr.units, u):
			case vm.tier == capacity.TierSpot:
				released = append(released, u)
			default:
				inUse = append(inUse, u)
			}
		}
	}
	if len(inUse) > 0 {
		m.expectErr(what, err, capacity.CodeUnitsInUse, inUse)
		return
	}
	m.expectOK(what, err)
	nr.released = sorted(released)
	if !same(res.Reservation.ReleasedUnitIDs, nr.released) || res.Reservation.Status != status {
		m.mismatch("%s: created %+v, model released %v", what, res.Reservation, nr.released)
	}
	m.res[node+"/"+id] = nr
	n.version++
}

// drawExisting draws a reservation of any node, those in status first.
func (m *model) drawExisting(t *rapid.T, status capacity.Status) *mRes {
	keys := slices.Sorted(maps.Keys(m.res))
	if len(keys) == 0 {
		return nil
	}
	slices.SortStableFunc(keys, func(a, b string) int {
		return cmpBool(statusAt(m.res[a], m.clock) == status, statusAt(m.res[b], m.clock) == status)
	})
	return m.res[rapid.SampledFrom(keys).Draw(t, "res")]
}

// stepCancel cancels a reservation.
func (m *model) stepCancel(t *rapid.T) {
	r := m.drawExisting(t, capacity.StatusPending)
	if r == nil {
		return
	}
	m.touched[r.node] = true
	m.step("cancel")
	what := fmt.Sprintf("cancel %s/%s (%s)", r.node, r.id, statusAt(r, m.clock))
	res, err := m.svc.CancelReservation(m.ctx, mOperator, capacity.ReservationChange{NodeID: r.node, ReservationID: r.id}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	switch statusAt(r, m.clock) {
	case capacity.StatusExpired:
		m.expectErr(what, err, capacity.CodeInvalidTransition, nil)
		return
	case capacity.StatusCancelled:
		m.expectOK(what, err)
	default:
		m.expectOK(what, err)
		r.status = capacity.StatusCancelled
		r.version++
		m.nodes[r.node].version++
	}
	var on []string
	for _, vm := range m.liveVMs(r.node) {
		if meet(vm.units, r.units) {
			on = append(on, vm.id)
		}
	}
	if got := capacity.VMIDs(res.VMsOnUnits); !same(got, on) || res.Reservation.Status != capacity.StatusCancelled {
		m.mismatch("%s: answered %s with VMs %v, model VMs %v", what, res.Reservation.Status, got, on)
	}
	for _, sc := range m.scheds {
		if sc.node == r.node && sc.res == r.id && sc.state == capacity.ScheduledPending {
			sc.state, sc.code, sc.loose = capacity.ScheduledCancelled, capacity.CodeReservationNotActive, m.inj != nil
		}
	}
}

// stepReaffirm reaffirms a reservation.
func (m *model) stepReaffirm(t *rapid.T) {
	r := m.drawExisting(t, capacity.StatusNeedsReview)
	if r == nil {
		return
	}
	m.touched[r.node] = true
	m.step("reaffirm")
	n := m.nodes[r.node]
	what := fmt.Sprintf("reaffirm %s/%s (%s)", r.node, r.id, statusAt(r, m.clock))
	res, err := m.svc.ReaffirmReservation(m.ctx, mOperator, capacity.ReservationChange{NodeID: r.node, ReservationID: r.id}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if statusAt(r, m.clock) != capacity.StatusNeedsReview {
		m.expectErr(what, err, capacity.CodeInvalidTransition, nil)
		return
	}
	if gone := minus(r.units, n.units); len(gone) > 0 {
		m.expectErr(what, err, capacity.CodeUnknownUnits, gone)
		return
	}
	m.expectOK(what, err)
	r.status, r.gen = capacity.StatusActive, n.gen
	r.released = sorted(minus(r.released, minus(r.released, n.units)))
	r.version++
	n.version++
	if !same(res.Reservation.ReleasedUnitIDs, r.released) || res.Reservation.TopologyGen != n.gen {
		m.mismatch("%s: answered %+v, model released %v gen %d", what, res.Reservation, r.released, n.gen)
	}
}

// stepTopology changes a node's unit list (or sends it as it is), sometimes against a
// generation that is no longer the node's.
func (m *model) stepTopology(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	units := slices.Clone(n.units)
	if len(units) > 1 && chance(t, 50, "remove") {
		i := rapid.IntRange(0, len(units)-1).Draw(t, "removeAt")
		units = slices.Delete(units, i, i+1)
	}
	if chance(t, 50, "add") {
		units = append(units, fmt.Sprintf("u%d", n.nextU))
	}
	req := capacity.TopologyRequest{NodeID: node, UnitIDs: units}
	switch rapid.IntRange(0, 9).Draw(t, "expectedGen") {
	case 7, 8:
		req.ExpectedTopologyGen = ptr(n.gen)
	case 9:
		if n.gen > 1 {
			req.ExpectedTopologyGen = ptr(n.gen - 1)
		}
	}
	m.step("topology")
	c := mCall{kind: capacity.ActionTopologySet, p: mOperator, topo: req, meta: capacity.RequestMeta{RequestID: m.newID("req-")}}
	if chance(t, 25, "topologyEvent") {
		// A Node Topology Changed event from the fleet: keyed by its event id.
		c.p, c.meta.Via, c.meta.EventID = mFleet, capacity.ViaEvent, m.newID("ev-")
		c.topo.IdempotencyKey = capacity.EventKeyPrefix + c.meta.EventID
		m.calls = append(m.calls, c)
	}
	m.topologyCall(c)
}

// topologyCall runs a topology change and checks its answer against the model, which it
// then moves on.
func (m *model) topologyCall(c mCall) {
	req, n, node := c.topo, m.nodes[c.topo.NodeID], c.topo.NodeID
	m.touched[node] = true
	units := req.UnitIDs
	what := fmt.Sprintf("topology %+v by %s (node at gen %d, units %v)", req, c.p.KeyID, n.gen, n.units)
	res, err := m.svc.SetTopology(m.ctx, c.p, req, c.meta)
	if m.transient(err) {
		return
	}
	fp := fingerprint(c.kind, req)
	if _, ok := m.replay(what, node, c.p, req.IdempotencyKey, fp, res, func() bool { return res.Replayed }, err); ok {
		return
	}
	if req.ExpectedTopologyGen != nil && *req.ExpectedTopologyGen != n.gen {
		m.expectErr(what, err, capacity.CodeTopologyChanged, nil)
		return
	}
	m.expectOK(what, err)
	defer m.remember(node, c.p, req.IdempotencyKey, fp, res)
	changed := !same(units, n.units)
	if res.Changed != changed {
		m.mismatch("%s: changed %v, model %v", what, res.Changed, changed)
	}
	if !changed {
		return
	}
	if slices.Contains(units, fmt.Sprintf("u%d", n.nextU)) {
		n.nextU++
	}
	n.units, n.gen = units, n.gen+1
	n.version++
	var review []string
	for _, r := range m.reservations(node) {
		if statusAt(r, m.clock) == capacity.StatusActive {
			r.status = capacity.StatusNeedsReview
			r.version++
			review = append(review, r.id)
		}
	}
	if !same(res.NeedsReview, review) || res.Node.TopologyGen != n.gen {
		m.mismatch("%s: needs review %v at gen %d, model %v at %d", what, res.NeedsReview, res.Node.TopologyGen, review, n.gen)
	}
}

// stepClock lets time pass: reservations start and end.
func (m *model) stepClock(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 25 * time.Hour}).Draw(t, "advance")
	m.step("clock")
	for _, id := range mNodeIDs {
		m.touched[id] = true // every node's invariants hold at the new time
	}
	m.clock = m.clock.Add(d)
}
