package capacity_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/capacity"
)

// ---- the reference rules ----

// access is the caller's role on a reservation: "manage", "view" or "" (none).
func (m *model) access(p capacity.Principal, r *mRes) string {
	n := m.nodes[r.node]
	switch {
	case p.Operator, p.OrgID == n.owner, slices.Contains(r.managing, p.OrgID):
		return "manage"
	case slices.Contains(r.allowed, p.OrgID):
		return "view"
	}
	return ""
}

// authorize is the check of who may move a reservation's capacity: 404 or 403, else "".
func (m *model) authorize(p capacity.Principal, node, resID string) capacity.Code {
	if !slices.Contains(p.Permissions, capacity.PermCapacity) {
		return capacity.CodeNotFound
	}
	r := m.res[node+"/"+resID]
	if r == nil {
		return capacity.CodeNotFound
	}
	switch m.access(p, r) {
	case "":
		return capacity.CodeNotFound
	case "view":
		return capacity.CodeForbidden
	}
	return ""
}

// drawCaller draws the caller of a step on the node, which it marks touched, and counts the
// step as kind; what names the call, by the caller, for mismatches.
func (m *model) drawCaller(t *rapid.T, node, kind, call string) (p capacity.Principal, what string) {
	m.touched[node] = true
	p = rapid.SampledFrom(mCallers).Draw(t, "caller")
	m.step(kind)
	return p, fmt.Sprintf("%s by %s", call, p.KeyID)
}

// lostOrRefused reports whether a call on the reservation is settled before its own rules:
// lost to a transient fault (nothing to model), or refused for the caller's rights (checked).
func (m *model) lostOrRefused(what string, err error, p capacity.Principal, node, resID string) bool {
	if m.transient(err) {
		return true
	}
	if code := m.authorize(p, node, resID); code != "" {
		m.expectErr(what, err, code, nil)
		return true
	}
	return false
}

func ended(r *mRes, t time.Time) bool  { return r.end != nil && !t.Before(*r.end) }
func inTerm(r *mRes, t time.Time) bool { return !t.Before(r.start) && !ended(r, t) }

// statusAt is what a reader sees: ended and not cancelled reads expired.
func statusAt(r *mRes, t time.Time) capacity.Status {
	if r.status != capacity.StatusCancelled && ended(r, t) {
		return capacity.StatusExpired
	}
	return r.status
}

func (m *model) liveVMs(node string) []*mVM {
	return onNode(m.vms, node, func(vm *mVM) (string, string) { return vm.node, vm.id })
}

func (m *model) reservations(node string) []*mRes {
	return onNode(m.res, node, func(r *mRes) (string, string) { return r.node, r.id })
}

// onNode returns the items of all on the node (of is an item's node and id), by id.
func onNode[T any](all map[string]*T, node string, of func(*T) (node, id string)) []*T {
	var out []*T
	for _, it := range all {
		if n, _ := of(it); n == node {
			out = append(out, it)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		_, a := of(out[i])
		_, b := of(out[j])
		return a < b
	})
	return out
}

func occupiedBy(vms []*mVM, units []string) []string {
	var out []string
	for _, u := range units {
		for _, vm := range vms {
			if slices.Contains(vm.units, u) {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

func meet(a, b []string) bool {
	return slices.ContainsFunc(a, func(x string) bool { return slices.Contains(b, x) })
}

func minus(a, b []string) []string {
	out := []string{}
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// capPlan is the model's decision of a reclaim or release.
type capPlan struct {
	err              capacity.Code
	errUnits         []string
	released         []string
	victims, skipped []string
	changes          bool
	etagKey          string
}

func (m *model) decideCapacity(action string, p capacity.Principal, req capacity.CapacityRequest) capPlan {
	if code := m.authorize(p, req.NodeID, req.ReservationID); code != "" {
		return capPlan{err: code}
	}
	r := m.res[req.NodeID+"/"+req.ReservationID]
	n := m.nodes[req.NodeID]
	switch {
	case r.status != capacity.StatusActive:
		return capPlan{err: capacity.CodeReservationNotActive}
	case !inTerm(r, m.clock):
		return capPlan{err: capacity.CodeOutsideTerm}
	case r.gen != n.gen:
		return capPlan{err: capacity.CodeTopologyChanged}
	}
	if bad := minus(req.UnitIDs, r.units); len(bad) > 0 {
		return capPlan{err: capacity.CodeUnitsNotReserved, errUnits: bad}
	}
	var pl capPlan
	if action == capacity.ActionRelease {
		newly := minus(req.UnitIDs, r.released)
		if busy := occupiedBy(m.liveVMs(req.NodeID), newly); len(busy) > 0 {
			return capPlan{err: capacity.CodeUnitsInUse, errUnits: busy}
		}
		pl.released = sorted(append(slices.Clone(r.released), newly...))
		pl.changes = len(newly) > 0
		return pl
	}
	pl.released = minus(r.released, req.UnitIDs)
	pl.victims, pl.skipped = []string{}, []string{}
	for _, vm := range m.liveVMs(req.NodeID) {
		if vm.state != capacity.VMRunning || !meet(vm.units, req.UnitIDs) {
			continue
		}
		if vm.tier == capacity.TierSpot {
			pl.victims = append(pl.victims, vm.id)
		} else {
			pl.skipped = append(pl.skipped, vm.id)
		}
	}
	pl.changes = len(pl.victims) > 0 || len(pl.released) != len(r.released)
	pl.etagKey = fmt.Sprintf("%s|%s|v%d|g%d|%v|%v|%d|%v|%v", req.NodeID, r.id, r.version, n.gen, sorted(req.UnitIDs),
		sorted(pl.released), req.GraceSeconds, pl.victims, pl.skipped)
	return pl
}

// ifMatches is the model's If-Match: "*", or a dry run's ETag whose plan is the current one.
func (m *model) ifMatches(ifMatch, key string) bool {
	return ifMatch == "*" || m.etags[ifMatch] == key
}

// fingerprint is the model's own identity of a request under an Idempotency-Key.
func fingerprint(kind string, v any) string {
	switch r := v.(type) {
	case capacity.CapacityRequest:
		r.UnitIDs, r.IfMatch, r.IdempotencyKey = sorted(r.UnitIDs), "", ""
		v = r
	case capacity.PlacementRequest:
		r.UnitIDs, r.IdempotencyKey = sorted(r.UnitIDs), ""
		v = r
	}
	b, _ := json.Marshal(v)
	return kind + string(b)
}

func scope(node string, p capacity.Principal, key string) string {
	return node + "|" + p.KeyID + "|" + p.OrgID + "|" + key
}

// replayed looks up a request's stored answer: (answer, true, "") to replay, ("", false,
// code) when the key was used for another request, ("", false, "") when nothing binds it.
func (m *model) replayed(node string, p capacity.Principal, key, fp string) ([]byte, bool, capacity.Code) {
	if key == "" {
		return nil, false, ""
	}
	rec, ok := m.records[scope(node, p, key)]
	if !ok || !m.clock.Before(rec.expires) {
		return nil, false, ""
	}
	if rec.fingerprint != fp {
		return nil, false, capacity.CodeIdempotencyKeyReused
	}
	return rec.answer, true, ""
}

// replay checks the answer to a call that the model says its Idempotency-Key binds: the
// stored answer, replayed, or the refusal of a key used for another request. It reports
// whether the key bound the call.
func (m *model) replay(what, node string, p capacity.Principal, key, fp string, res any, replayed func() bool, err error) (capacity.Code, bool) {
	answer, ok, code := m.replayed(node, p, key, fp)
	switch {
	case code != "":
		m.expectErr(what, err, code, nil)
	case ok:
		code = "replayed"
		if err != nil {
			m.mismatch("%s: answered %v (%s), model replays the stored answer", what, err, capacity.ErrorCode(err))
		}
		got, _ := json.Marshal(res)
		if !replayed() || string(got) != string(answer) {
			m.mismatch("%s: replayed=%v %s, model replays %s", what, replayed(), got, answer)
		}
		m.stats.outcome(m.kind + " -> replayed")
	}
	return code, code != ""
}

func (m *model) remember(node string, p capacity.Principal, key, fp string, answer any) {
	if key == "" {
		return
	}
	b, err := json.Marshal(answer)
	if err != nil {
		m.t.Fatalf("encode answer: %v", err)
	}
	m.records[scope(node, p, key)] = mRecord{fingerprint: fp, answer: b, expires: m.clock.Add(24 * time.Hour)}
}

// ---- comparing answers ----

func (m *model) mismatch(format string, args ...any) {
	m.stats.mu.Lock()
	m.stats.mismatches++
	m.stats.mu.Unlock()
	m.t.Fatalf("model mismatch: "+format, args...)
}

// expectErr checks that err has the code the model predicts (and its unit list, if any).
func (m *model) expectErr(what string, err error, code capacity.Code, units []string) capacity.Code {
	m.stats.outcome(m.kind + " -> " + string(code))
	if err == nil {
		m.mismatch("%s: succeeded, model says %s", what, code)
	}
	if got := capacity.ErrorCode(err); got != code {
		m.mismatch("%s: answered %s (%v), model says %s", what, got, err, code)
	}
	if units != nil {
		var e *capacity.Error
		if !errors.As(err, &e) || !slices.Equal(sorted(e.UnitIDs), sorted(units)) {
			m.mismatch("%s: %s names units %v, model says %v", what, code, e.UnitIDs, units)
		}
	}
	return code
}

// transient reports, under AWS faults, an answer that the faults may leave a call with however
// the model decides (throttled, concurrent_modification): it says nothing was applied, which
// the check after the step verifies against the store, and the model stays as it was.
func (m *model) transient(err error) bool {
	if m.inj == nil {
		return false
	}
	switch code := capacity.ErrorCode(err); code {
	case capacity.CodeThrottled, capacity.CodeConcurrentModification:
		m.stats.outcome(m.kind + " -> " + string(code) + " (under faults)")
		return true
	}
	return false
}

func (m *model) expectOK(what string, err error) {
	m.stats.outcome(m.kind + " -> ok")
	if err != nil {
		m.mismatch("%s: answered %v (%s), model says it succeeds", what, err, capacity.ErrorCode(err))
	}
}

func same(a, b []string) bool { return slices.Equal(sorted(a), sorted(b)) }
