package capacity_test

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
)

// stepSchedule schedules a reclaim.
func (m *model) stepSchedule(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	resID := m.drawReservation(t, node)
	pool := m.nodes[node].units
	if r := m.res[node+"/"+resID]; r != nil {
		pool = r.units
	}
	p := rapid.SampledFrom(mCreators).Draw(t, "creator")
	req := capacity.CapacityRequest{NodeID: node, ReservationID: resID, UnitIDs: drawUnits(t, pool, "units"),
		GraceSeconds: rapid.SampledFrom([]int{0, 30}).Draw(t, "grace")}
	at := m.clock.Add(rapid.SampledFrom([]time.Duration{10 * time.Minute, time.Hour, 26 * time.Hour, 0}).Draw(t, "at"))
	m.step("schedule")
	what := fmt.Sprintf("schedule %+v at %v by %s", req, at, p.KeyID)
	res, err := m.svc.ScheduleReclaim(m.ctx, p, req, at, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, node, resID) {
		return
	}
	if pl := m.decideCapacity(capacity.ActionReclaim, p, req); pl.err != "" {
		m.expectErr(what, err, pl.err, pl.errUnits)
		return
	}
	if r := m.res[node+"/"+resID]; !at.After(m.clock) || !inTerm(r, at) {
		m.expectErr(what, err, capacity.CodeInvalidRequest, nil)
		return
	}
	m.expectOK(what, err)
	sr := res.Scheduled
	if sr.State != capacity.ScheduledPending || !sr.At.Equal(at) || !same(sr.UnitIDs, req.UnitIDs) || m.scheds[sr.ID] != nil {
		m.mismatch("%s: scheduled %+v", what, sr)
	}
	m.scheds[sr.ID] = &mSched{id: sr.ID, node: node, res: resID, units: sorted(req.UnitIDs), grace: req.GraceSeconds, at: at,
		creator: p, state: capacity.ScheduledPending}
}

func (m *model) drawScheduled(t *rapid.T) *mSched {
	ids := slices.Sorted(maps.Keys(m.scheds))
	if len(ids) == 0 {
		return nil
	}
	// Pending ones first: rapid draws the first ones most often.
	slices.SortStableFunc(ids, func(a, b string) int {
		return cmpBool(m.scheds[a].state == capacity.ScheduledPending, m.scheds[b].state == capacity.ScheduledPending)
	})
	return m.scheds[rapid.SampledFrom(ids).Draw(t, "scheduled")]
}

// stepFire fires a scheduled reclaim, mostly once its time has come (the clock moves on to
// it), sometimes early, and again (Scheduler may deliver a firing twice).
func (m *model) stepFire(t *rapid.T) {
	sc := m.drawScheduled(t)
	if sc == nil {
		return
	}
	if m.clock.Before(sc.at) && !chance(t, 20, "early") {
		m.clock = sc.at
		for _, id := range mNodeIDs {
			m.touched[id] = true
		}
	}
	m.touched[sc.node] = true
	m.step(fmt.Sprintf("fire (%s)", sc.state))
	meta := capacity.RequestMeta{RequestID: m.newID("req-"), Via: capacity.ViaSchedule, EventID: m.newID("ev-")}
	what := fmt.Sprintf("fire %s (%s, at %v, now %v, creator %s)", sc.id, sc.state, sc.at, m.clock, sc.creator.KeyID)
	res, err := m.svc.FireScheduledReclaim(m.ctx, sc.node, sc.res, sc.id, meta)
	if m.transient(err) {
		return
	}
	switch sc.state {
	case capacity.ScheduledCancelled:
		m.expectErr(what, err, capacity.CodeScheduledReclaimCancelled, nil)
		return
	case capacity.ScheduledRefused:
		m.expectErr(what, err, sc.code, nil)
		return
	case capacity.ScheduledPending:
		if m.clock.Before(sc.at.Add(-capacity.FiringSkew)) {
			m.expectErr(what, err, capacity.CodeScheduledReclaimNotDue, nil)
			return
		}
		if m.revoked[sc.creator.KeyID] {
			sc.state, sc.code = capacity.ScheduledRefused, m.expectErr(what, err, capacity.CodeCreatorKeyInvalid, nil)
			sc.loose = m.inj != nil
			return
		}
	}
	creator := capacity.Principal{KeyID: sc.creator.KeyID, OrgID: sc.creator.OrgID, Operator: sc.creator.Operator,
		Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: sc.node, ReservationID: sc.res, UnitIDs: sc.units, GraceSeconds: sc.grace,
		IdempotencyKey: capacity.FireIdempotencyKey(sc.id)}
	code := m.expectCapacity(mCall{kind: capacity.ActionReclaim, p: creator, cap: req, meta: meta, fire: sc}, what, res, err)
	if sc.state != capacity.ScheduledPending {
		return
	}
	switch code {
	case "":
		sc.state, sc.reclaimID = capacity.ScheduledCompleted, res.ReclaimID
	case "replayed":
		m.mismatch("%s: a pending scheduled reclaim replayed an answer", what)
	default:
		sc.state, sc.code, sc.loose = capacity.ScheduledRefused, code, m.inj != nil
	}
}

// stepUnschedule cancels a scheduled reclaim.
func (m *model) stepUnschedule(t *rapid.T) {
	sc := m.drawScheduled(t)
	if sc == nil {
		return
	}
	p, what := m.drawCaller(t, sc.node, fmt.Sprintf("cancel scheduled (%s)", sc.state), fmt.Sprintf("cancel scheduled %s (%s)", sc.id, sc.state))
	res, err := m.svc.CancelScheduledReclaim(m.ctx, p, sc.node, sc.res, sc.id, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.lostOrRefused(what, err, p, sc.node, sc.res) {
		return
	}
	switch sc.state {
	case capacity.ScheduledCompleted, capacity.ScheduledRefused:
		m.expectErr(what, err, capacity.CodeScheduledReclaimFired, nil)
		return
	case capacity.ScheduledPending:
		sc.state = capacity.ScheduledCancelled
	}
	m.expectOK(what, err)
	if res.State != capacity.ScheduledCancelled {
		m.mismatch("%s: answered %s", what, res.State)
	}
}

// stepRevoke revokes the key of a creator of scheduled reclaims.
func (m *model) stepRevoke(t *rapid.T) {
	if !chance(t, 25, "revoke") {
		return // rarely: a revoked key's scheduled reclaims are refused from then on
	}
	p := rapid.SampledFrom(mCreators).Draw(t, "key")
	m.step("revoke key")
	k, err := m.svc.RevokeKey(m.ctx, mOperator, capacity.KeyRevocation{KeyID: p.KeyID}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	m.expectOK("revoke "+p.KeyID, err)
	if !k.Revoked {
		m.mismatch("revoke %s: answered a key not revoked", p.KeyID)
	}
	m.revoked[p.KeyID] = true
}
