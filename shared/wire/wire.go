// Package wire is the JSON form of the domain's results that callers see: the HTTP API answers
// with it and the events carry the same bodies, so the two cannot drift apart.
package wire

import (
	"slices"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// ReservationJSON is the API's reservation, plus the reclaim fields on reclaim responses.
type ReservationJSON struct {
	ID              string   `json:"id"`
	NodeID          string   `json:"nodeId"`
	AllowedOrgIDs   []string `json:"allowedOrgIds"`
	ReservedUnitIDs []string `json:"reservedUnitIds"`
	StartsAt        string   `json:"startsAt"`
	Status          string   `json:"status"`
	EndsAt          string   `json:"endsAt,omitempty"`
	ManagingOrgIDs  []string `json:"managingOrgIds"`
	ReleasedUnitIDs []string `json:"releasedUnitIds"`
	ContractRef     string   `json:"contractRef,omitempty"`
	CreatedAt       string   `json:"createdAt,omitempty"`
	UpdatedAt       string   `json:"updatedAt,omitempty"`
	Reason          string   `json:"reason,omitempty"`
	TopologyGen     int64    `json:"topologyGen"`

	// Reclaim only. ReclaimID names the operation that terminates the evicted VMs; it is
	// absent when nothing was evicted.
	ReclaimID      string    `json:"reclaimId,omitempty"`
	Terminated     *[]string `json:"terminated,omitempty"`
	Skipped        *[]string `json:"skipped,omitempty"`
	WouldTerminate *[]string `json:"wouldTerminate,omitempty"`
	WouldSkip      *[]string `json:"wouldSkip,omitempty"`
	// TerminateAfter is when the evicted VMs' termination begins (the grace's end); only on
	// a reclaim that evicted something.
	TerminateAfter string `json:"terminateAfter,omitempty"`
	// PlanETag (dry runs only) names the plan: a real reclaim sent with it in If-Match runs
	// only if it would do exactly this.
	PlanETag string `json:"planEtag,omitempty"`
}

// VMJSON is a placed VM.
type VMJSON struct {
	ID        string   `json:"id"`
	NodeID    string   `json:"nodeId"`
	OrgID     string   `json:"orgId"`
	Tier      string   `json:"tier"`
	UnitIDs   []string `json:"unitIds"`
	State     string   `json:"state"`
	CreatedAt string   `json:"createdAt"`
}

func timeString(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func list(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Reservation is r as the API shows it.
func Reservation(r capacity.Reservation) ReservationJSON {
	out := ReservationJSON{
		ID: r.ID, NodeID: r.NodeID, AllowedOrgIDs: list(r.AllowedOrgIDs), ReservedUnitIDs: list(r.ReservedUnitIDs),
		StartsAt: timeString(r.StartsAt), Status: string(r.Status), ManagingOrgIDs: list(r.ManagingOrgIDs),
		ReleasedUnitIDs: list(r.ReleasedUnitIDs), ContractRef: r.ContractRef,
		CreatedAt: timeString(r.CreatedAt), UpdatedAt: timeString(r.UpdatedAt), Reason: r.Reason,
		TopologyGen: r.TopologyGen,
	}
	if r.EndsAt != nil {
		out.EndsAt = timeString(*r.EndsAt)
	}
	return out
}

// Reclaim is the answer to a reclaim: the reservation after it, and what it evicted or would.
func Reclaim(res *capacity.CapacityResult) ReservationJSON {
	out := Reservation(res.Reservation)
	out.Reason = res.Reason // the call's reason, not the reservation's
	out.ReclaimID = res.ReclaimID
	if res.ReclaimID != "" && !res.DryRun {
		out.TerminateAfter = timeString(res.TerminateAfter)
	}
	terminated, skipped := list(res.Terminated), list(res.Skipped)
	if res.DryRun {
		out.WouldTerminate, out.WouldSkip = &terminated, &skipped
		out.PlanETag = res.PlanETag
	} else {
		out.Terminated, out.Skipped = &terminated, &skipped
	}
	return out
}

// ReclaimPlanJSON is the answer to a reclaim plan: the released units chosen, least
// disruptive first, the units already exclusive (not counted, not taken), and the dry run of
// a reclaim of the chosen ones.
type ReclaimPlanJSON struct {
	Count        int      `json:"count"`
	UnitIDs      []string `json:"unitIds"`
	AlreadyYours []string `json:"alreadyYours"`
	ReservationJSON
}

// ReclaimPlan is the answer to a reclaim plan.
func ReclaimPlan(p *capacity.ReclaimPlan) ReclaimPlanJSON {
	return ReclaimPlanJSON{Count: p.Count, UnitIDs: list(p.UnitIDs), AlreadyYours: list(p.AlreadyYours), ReservationJSON: Reclaim(&p.CapacityResult)}
}

// VM is v as the API shows it.
func VM(v capacity.VM) VMJSON {
	return VMJSON{
		ID: v.ID, NodeID: v.NodeID, OrgID: v.OrgID, Tier: string(v.Tier), UnitIDs: list(v.UnitIDs),
		State: string(v.State), CreatedAt: timeString(v.CreatedAt),
	}
}

// OperationJSON is a reclaim operation: the termination of the VMs a reclaim evicted.
type OperationJSON struct {
	ID            string          `json:"id"`
	NodeID        string          `json:"nodeId"`
	ReservationID string          `json:"reservationId"`
	State         string          `json:"state"`
	UnitIDs       []string        `json:"unitIds"`
	VMs           []VMOutcomeJSON `json:"vms,omitempty"`
	// VMCounts replaces VMs and ExecutionARN in the audience's redacted view.
	VMCounts     *VMCountsJSON `json:"vmCounts,omitempty"`
	ExecutionARN string        `json:"executionArn,omitempty"`
	// Attempt numbers the workflow's runs (1: the first; restarts and re-drives add one).
	Attempt int `json:"attempt,omitempty"`
	// Reason says why an operation failed without an outcome for every VM.
	Reason    string `json:"reason,omitempty"`
	CreatedAt string `json:"createdAt"`
	UpdatedAt string `json:"updatedAt,omitempty"`
}

// VMOutcomeJSON is one evicted VM and, once final, how its termination ended.
type VMOutcomeJSON struct {
	VMID    string `json:"vmId"`
	Outcome string `json:"outcome"` // pending | terminated | already-gone | force-ended | failed
	Error   string `json:"error,omitempty"`
	At      string `json:"at,omitempty"`
	Reason  string `json:"reason,omitempty"` // the operator's, on a force-end
	// Notice is what became of the VM's eviction notice to its agent (reclaims with a grace).
	Notice *VMNoticeJSON `json:"notice,omitempty"`
}

// VMNoticeJSON is the fate of a VM's eviction notice.
type VMNoticeJSON struct {
	State          string `json:"state"` // delivered | unsupported | unknown-vm | failed
	Error          string `json:"error,omitempty"`
	At             string `json:"at"`
	TerminateAfter string `json:"terminateAfter"`
}

// VMCountsJSON counts an operation's VMs by outcome.
type VMCountsJSON struct {
	Pending     int `json:"pending"`
	Terminated  int `json:"terminated"`
	AlreadyGone int `json:"alreadyGone"`
	Failed      int `json:"failed"`
}

// Operation is the caller's view of a reclaim operation.
func Operation(view *capacity.OperationView) OperationJSON {
	op := view.Operation
	out := OperationJSON{
		ID: op.ID, NodeID: op.NodeID, ReservationID: op.ReservationID, State: string(op.State),
		UnitIDs: list(op.UnitIDs), CreatedAt: timeString(op.CreatedAt), UpdatedAt: timeString(op.UpdatedAt),
	}
	if view.Redacted {
		c := view.Counts
		out.VMCounts = &VMCountsJSON{Pending: c.Pending, Terminated: c.Terminated, AlreadyGone: c.AlreadyGone, Failed: c.Failed}
		return out
	}
	out.VMs, out.ExecutionARN, out.Attempt, out.Reason = []VMOutcomeJSON{}, op.ExecutionARN, op.CurrentAttempt(), op.Reason
	for _, vm := range slices.Sorted(slices.Values(op.VMIDs)) {
		v := VMOutcomeJSON{VMID: vm, Outcome: "pending"}
		if o, ok := op.Final(vm); ok { // a re-driven VM's old failure is pending again
			v.Outcome, v.Error, v.At, v.Reason = string(o.Outcome), o.Error, timeString(o.At), o.Reason
		}
		if n, ok := op.Notices[vm]; ok {
			v.Notice = &VMNoticeJSON{State: string(n.State), Error: n.Error, At: timeString(n.At), TerminateAfter: timeString(n.TerminateAfter)}
		}
		out.VMs = append(out.VMs, v)
	}
	return out
}

// ScheduledReclaimJSON is a scheduled reclaim: a reclaim that runs at a later time.
type ScheduledReclaimJSON struct {
	ID             string   `json:"id"`
	NodeID         string   `json:"nodeId"`
	ReservationID  string   `json:"reservationId"`
	UnitIDs        []string `json:"unitIds"`
	Reason         string   `json:"reason"` // "" when none was given
	GraceSeconds   int      `json:"graceSeconds"`
	At             string   `json:"at"`
	State          string   `json:"state"` // scheduled | cancelled | completed | refused
	CreatedAt      string   `json:"createdAt"`
	CreatedByOrgID string   `json:"createdByOrgId"`
	// ReclaimID names the reclaim operation of a completed one that evicted VMs.
	ReclaimID string `json:"reclaimId,omitempty"`
	// Code and Detail say why a refused one was refused (as the problem of a reclaim), or why
	// the service cancelled one (reservation_not_active: its reservation was cancelled).
	Code        string `json:"code,omitempty"`
	Detail      string `json:"detail,omitempty"`
	FiredAt     string `json:"firedAt,omitempty"`
	CancelledAt string `json:"cancelledAt,omitempty"`
}

// ScheduledPageJSON is a page of a reservation's scheduled reclaims, in order of at;
// NextCursor is absent on the last page.
type ScheduledPageJSON struct {
	ScheduledReclaims []ScheduledReclaimJSON `json:"scheduledReclaims"`
	NextCursor        string                 `json:"nextCursor,omitempty"`
}

// ScheduledPage is a page as the API shows it.
func ScheduledPage(p *capacity.ScheduledPage) ScheduledPageJSON {
	out := ScheduledPageJSON{ScheduledReclaims: make([]ScheduledReclaimJSON, 0, len(p.Scheduled)), NextCursor: p.NextCursor}
	for _, sr := range p.Scheduled {
		out.ScheduledReclaims = append(out.ScheduledReclaims, ScheduledReclaim(sr))
	}
	return out
}

// ScheduledReclaim is sr as the API shows it.
func ScheduledReclaim(sr capacity.ScheduledReclaim) ScheduledReclaimJSON {
	out := ScheduledReclaimJSON{
		ID: sr.ID, NodeID: sr.NodeID, ReservationID: sr.ReservationID, UnitIDs: list(sr.UnitIDs), Reason: sr.Reason,
		GraceSeconds: sr.GraceSeconds, At: timeString(sr.At), State: string(sr.State), CreatedAt: timeString(sr.CreatedAt),
		CreatedByOrgID: sr.CreatorOrgID, ReclaimID: sr.ReclaimID, Code: string(sr.Code), Detail: sr.Detail,
	}
	if sr.FiredAt != nil {
		out.FiredAt = timeString(*sr.FiredAt)
	}
	if sr.CancelledAt != nil {
		out.CancelledAt = timeString(*sr.CancelledAt)
	}
	return out
}
