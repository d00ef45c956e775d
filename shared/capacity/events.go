package capacity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Event sources on the capacity bus.
const (
	// SourceCapacity is the source of everything the service publishes.
	SourceCapacity = "openrelay.capacity"
	// SourceSchedule is the service's own scheduled reclaims firing (always accepted).
	SourceSchedule = "openrelay.capacity.schedule"
	// SourcePlatformScheduler is the platform's scheduler: its requests act as an operator.
	SourcePlatformScheduler = "openrelay.scheduler"
	// SourceFleet is the platform's fleet management: the default source of topology
	// changes, which act as an operator.
	SourceFleet = "openrelay.fleet"
)

// Detail types on the capacity bus.
const (
	DetailReclaimRequested   = "Capacity Reclaim Requested" // inbound
	DetailReclaimCompleted   = "Capacity Reclaim Completed" // outcome of an inbound request
	DetailReclaimRefused     = "Capacity Reclaim Refused"
	DetailEvictionNotice     = "Spot VM Eviction Notice"
	DetailVMTerminated       = "Spot VM Terminated"
	DetailOperationCompleted = "Reclaim Operation Completed"
	DetailOperationFailed    = "Reclaim Operation Failed"
	DetailTopologyChanged    = "Node Topology Changed" // inbound
	DetailTopologyApplied    = "Node Topology Applied" // outcome of an inbound topology change
	DetailTopologyRefused    = "Node Topology Refused"
)

// InboundDetailTypes are the detail types the service accepts from other sources (the
// reclaim intake, shared/eventapi, which the stack routes them to); it publishes the others.
var InboundDetailTypes = []string{DetailReclaimRequested, DetailTopologyChanged}

// ReasonReclaimedByOwner is the reasonCode of an eviction notice.
const ReasonReclaimedByOwner = "reclaimed-by-capacity-owner"

// Event is one event to publish. ID is the detail's eventId: stable across every retry and
// restart that publishes the same fact, so a consumer deduplicates on it.
type Event struct {
	ID         string
	DetailType string
	Detail     any // JSON-encoded as the event's detail
	Time       time.Time
}

// Publisher puts events on the bus. Publish returns nil only when every event was accepted;
// a retry publishes them again (consumers deduplicate on the eventId).
type Publisher interface {
	Publish(ctx context.Context, events []Event) error
}

// VMEventDetail is what the events about one evicted VM, for its buyer, say first: the event,
// the VM and whose it is, where it ran and the reclaim that evicts it. Embedded, its members
// come first in the detail's JSON.
type VMEventDetail struct {
	EventID       string   `json:"eventId"`
	OrgID         string   `json:"orgId"`
	VMID          string   `json:"vmId"`
	NodeID        string   `json:"nodeId"`
	UnitIDs       []string `json:"unitIds"`
	ReservationID string   `json:"reservationId"`
	ReclaimID     string   `json:"reclaimId"`
}

// vmEvent is the VMEventDetail of the operation's VM vmID, under the event id eventID.
func (o Operation) vmEvent(eventID, vmID string) VMEventDetail {
	v := o.Victim(vmID)
	return VMEventDetail{EventID: eventID, OrgID: v.OrgID, VMID: vmID, NodeID: o.NodeID, UnitIDs: nonNil(v.UnitIDs),
		ReservationID: o.ReservationID, ReclaimID: o.ID}
}

// EvictionNoticeDetail is the detail of a Spot VM Eviction Notice, for the VM's buyer.
type EvictionNoticeDetail struct {
	VMEventDetail
	ReasonCode     string `json:"reasonCode"`
	TerminateAfter string `json:"terminateAfter"`
}

// VMTerminatedDetail is the detail of a Spot VM Terminated, for the VM's buyer. It carries no
// agent error text: that names node endpoints.
type VMTerminatedDetail struct {
	VMEventDetail
	Outcome string `json:"outcome"`
	At      string `json:"at"`
}

// OperationEndDetail is the detail of a Reclaim Operation Completed or Failed, for the node's
// owner.
type OperationEndDetail struct {
	EventID       string            `json:"eventId"`
	OwnerOrgID    string            `json:"ownerOrgId"`
	NodeID        string            `json:"nodeId"`
	ReservationID string            `json:"reservationId"`
	ReclaimID     string            `json:"reclaimId"`
	State         string            `json:"state"`
	Reason        string            `json:"reason,omitempty"`
	VMs           []OperationVM     `json:"vms"`
	Counts        OperationEndCount `json:"counts"`
	CreatedAt     string            `json:"createdAt"`
	EndedAt       string            `json:"endedAt"`
}

// OperationVM is one VM of an ended operation; Outcome is empty while it has none.
type OperationVM struct {
	VMID    string `json:"vmId"`
	OrgID   string `json:"orgId"`
	Outcome string `json:"outcome,omitempty"`
	Error   string `json:"error,omitempty"`
}

// OperationEndCount counts an ended operation's VMs by outcome.
type OperationEndCount struct {
	Terminated  int `json:"terminated"`
	AlreadyGone int `json:"alreadyGone"`
	Failed      int `json:"failed"`
	Pending     int `json:"pending"`
}

// ReclaimCompletedDetail is the detail of a Capacity Reclaim Completed: the outcome of an
// inbound reclaim request. Result is exactly the HTTP answer's body.
type ReclaimCompletedDetail struct {
	EventID            string `json:"eventId"`
	RequestEventID     string `json:"requestEventId"`
	RequestSource      string `json:"requestSource"`
	ScheduledReclaimID string `json:"scheduledReclaimId,omitempty"`
	NodeID             string `json:"nodeId"`
	ReservationID      string `json:"reservationId"`
	Result             any    `json:"result"`
}

// ReclaimRefusedDetail is the detail of a Capacity Reclaim Refused: an inbound reclaim
// request refused with the problem code and detail the HTTP API would answer.
type ReclaimRefusedDetail struct {
	EventID            string `json:"eventId"`
	RequestEventID     string `json:"requestEventId"`
	RequestSource      string `json:"requestSource"`
	ScheduledReclaimID string `json:"scheduledReclaimId,omitempty"`
	NodeID             string `json:"nodeId,omitempty"`
	ReservationID      string `json:"reservationId,omitempty"`
	Code               string `json:"code"`
	Detail             string `json:"detail"`
}

// TopologyAppliedDetail is the detail of a Node Topology Applied: the outcome of an inbound
// topology change. Result is exactly the HTTP answer's body to the same change.
type TopologyAppliedDetail struct {
	EventID        string `json:"eventId"`
	RequestEventID string `json:"requestEventId"`
	RequestSource  string `json:"requestSource"`
	NodeID         string `json:"nodeId"`
	Result         any    `json:"result"`
}

// TopologyRefusedDetail is the detail of a Node Topology Refused: an inbound topology change
// refused with the problem code and detail the HTTP API would answer.
type TopologyRefusedDetail struct {
	EventID        string `json:"eventId"`
	RequestEventID string `json:"requestEventId"`
	RequestSource  string `json:"requestSource"`
	NodeID         string `json:"nodeId,omitempty"`
	Code           string `json:"code"`
	Detail         string `json:"detail"`
}

// eventTime is a time in an event detail: RFC 3339 UTC seconds, like the API.
func eventTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// terminateAfter is when the operation's VMs may be terminated; operations committed before
// grace existed had none.
func (o Operation) terminateAfter() time.Time {
	if o.TerminateAfter.IsZero() {
		return o.CreatedAt
	}
	return o.TerminateAfter
}

// EvictionNotices are the notices of the operation's VMs that have no final outcome yet. Their
// ids do not depend on the attempt: a restart or re-drive that notifies again repeats them.
func EvictionNotices(op Operation) []Event {
	var out []Event
	for _, id := range op.Unfinished() {
		eid := op.ID + "/notice/" + id
		out = append(out, Event{
			ID: eid, DetailType: DetailEvictionNotice, Time: op.CreatedAt,
			Detail: EvictionNoticeDetail{
				VMEventDetail: op.vmEvent(eid, id),
				ReasonCode:    ReasonReclaimedByOwner, TerminateAfter: eventTime(op.terminateAfter()),
			},
		})
	}
	return out
}

// OperationReport is what the operation's outcomes say so far: a Spot VM Terminated per VM
// with a final outcome (its id names the attempt that recorded it, so a re-driven VM's new
// outcome is a new event), and the operation's end event once it has ended — every VM has a
// final outcome, or it failed with a reason. The end is derived from the operation, whoever
// wrote it, so the workflow and the reconciler publish the same events under the same ids.
func OperationReport(op Operation) []Event {
	var out []Event
	vms := slices.Sorted(slices.Values(op.VMIDs))
	for _, id := range vms {
		res, ok := op.Final(id)
		if !ok {
			continue
		}
		eid := fmt.Sprintf("%s/vm/%s/%d", op.ID, id, max(1, res.Attempt))
		out = append(out, Event{
			ID: eid, DetailType: DetailVMTerminated, Time: res.At,
			Detail: VMTerminatedDetail{VMEventDetail: op.vmEvent(eid, id), Outcome: string(res.Outcome), At: eventTime(res.At)},
		})
	}
	state, ended := op.endedAs()
	if !ended {
		return out
	}
	endedAt := op.endedAt()
	eid := fmt.Sprintf("%s/end/%d", op.ID, op.CurrentAttempt())
	d := OperationEndDetail{
		EventID: eid, OwnerOrgID: op.OwnerOrgID, NodeID: op.NodeID, ReservationID: op.ReservationID,
		ReclaimID: op.ID, State: string(state), VMs: []OperationVM{},
		CreatedAt: eventTime(op.CreatedAt), EndedAt: eventTime(endedAt),
	}
	if state == OpFailed {
		d.Reason = op.Reason
	}
	c := op.counts()
	d.Counts = OperationEndCount{Terminated: c.Terminated, AlreadyGone: c.AlreadyGone, Failed: c.Failed, Pending: c.Pending}
	for _, id := range vms {
		vm := OperationVM{VMID: id, OrgID: op.Victim(id).OrgID}
		if res, ok := op.Final(id); ok {
			vm.Outcome, vm.Error = string(res.Outcome), res.Error
		}
		d.VMs = append(d.VMs, vm)
	}
	dt := DetailOperationCompleted
	if state == OpFailed {
		dt = DetailOperationFailed
	}
	return append(out, Event{ID: eid, DetailType: dt, Time: endedAt, Detail: d})
}

// endedAs reports whether the operation has ended, and in which state: every VM has a final
// outcome (the state the outcomes say, or the one written if already written), or it failed
// with a reason (its workflow could not be run).
func (o Operation) endedAs() (OperationState, bool) {
	if o.Ended() {
		if o.State == OpCompleted || o.State == OpFailed {
			return o.State, true
		}
		return o.EndState(), true
	}
	if o.State == OpFailed && o.Reason != "" {
		return OpFailed, true
	}
	return "", false
}

// endedAt is when the operation ended: when its end was written (UpdatedAt of an ended
// operation), else when its last outcome was recorded.
func (o Operation) endedAt() time.Time {
	if o.State == OpCompleted || o.State == OpFailed {
		return o.UpdatedAt
	}
	var last time.Time
	for _, id := range o.VMIDs {
		if res, ok := o.Final(id); ok && res.At.After(last) {
			last = res.At
		}
	}
	if last.IsZero() {
		return o.UpdatedAt
	}
	return last
}

// counts counts the operation's VMs by their outcome final for its attempt.
func (o Operation) counts() OutcomeCounts {
	var c OutcomeCounts
	for _, id := range o.VMIDs {
		out, ok := o.Final(id) // a re-driven VM's old failure is pending
		switch {
		case !ok:
			c.Pending++
		case out.Outcome == OutcomeTerminated:
			c.Terminated++
		case out.Outcome == OutcomeAlreadyGone, out.Outcome == OutcomeForceEnded:
			c.AlreadyGone++
		default:
			c.Failed++
		}
	}
	return c
}

// OperationReader reads reclaim operations (shared/dynamo's Store).
type OperationReader interface {
	// GetOperation returns the operation, or an *Error with CodeNotFound.
	GetOperation(ctx context.Context, nodeID, opID string) (*Operation, error)
}

// ReportStore is what the Announcer reads and writes: the operation, and its end.
type ReportStore interface {
	OperationReader
	// EndOperation moves an operation terminating at op's attempt to its end state;
	// ErrConflict if it is no longer so (see TerminationStore).
	EndOperation(ctx context.Context, op Operation, state OperationState, now time.Time) error
}

// Announcer publishes a reclaim operation's events from its termination workflow: the
// notices before the grace period, the report after the terminations. Both read the
// operation and derive the events from it, so a retried or restarted task publishes the same
// events under the same ids. The report of an operation whose every VM is final ends it,
// after publishing: the end write is what says the report went out.
type Announcer struct {
	Store     ReportStore
	Publisher Publisher // nil: nothing published (a stack without a bus)
	Logger    *slog.Logger
	// Claims, if set, makes the report of an operation's end go out once per attempt: of two
	// runs of the report at once (a duplicate delivery, the reconciler), the one holding its
	// claim publishes and ends the operation.
	Claims ReportClaims
	// Metrics is told of the operations this Announcer ends (nil: none).
	Metrics Metrics
	Now     func() time.Time
}

// ReportClaims is the store of report claims (shared/dynamo's Store).
type ReportClaims interface {
	// ClaimReport takes the report claim of op's attempt for holder until the time: it
	// succeeds when there is none, a lapsed one, or holder's own; ErrConflict otherwise
	// (another run is reporting it).
	ClaimReport(ctx context.Context, op Operation, holder string, now, until time.Time) error
	// ReleaseReport drops holder's claim (its publish or its end write failed: a retry
	// reports).
	ReleaseReport(ctx context.Context, op Operation, holder string) error
}

// Notify publishes the eviction notices of the operation's VMs without a final outcome, for
// the workflow attempt running it, and returns how many. A task of an older attempt than the
// operation's publishes nothing: the current attempt's execution notifies for itself (under
// the same ids), and the older one must not announce a termination it will not carry out.
func (a *Announcer) Notify(ctx context.Context, nodeID, reclaimID string, attempt int) (int, error) {
	op, err := a.Store.GetOperation(ctx, nodeID, reclaimID)
	if err != nil {
		return 0, fmt.Errorf("read operation %s: %w", reclaimID, err)
	}
	if max(1, attempt) != op.CurrentAttempt() {
		a.logger().WarnContext(ctx, "eviction notices of an older attempt skipped", "reclaim_id", reclaimID,
			"task_attempt", max(1, attempt), "attempt", op.CurrentAttempt())
		return 0, nil
	}
	events := EvictionNotices(*op)
	if err := publish(ctx, a.Publisher, events); err != nil {
		return 0, fmt.Errorf("publish eviction notices of %s: %w", reclaimID, err)
	}
	a.logger().InfoContext(ctx, "eviction notices published", "reclaim_id", reclaimID, "node", nodeID, "events", len(events))
	return len(events), nil
}

// Report publishes what the operation's outcomes say (see OperationReport) and returns how
// many events. For an operation of the task's attempt whose every VM is final it then ends
// the operation (EndOperation), under the attempt's report claim: the events go first, so an
// operation that reads ended was reported, and a later duplicate publishes nothing. If the end
// write fails after the publish, the task fails and its retry (or the reconciler) publishes
// the same events, under the same ids, and ends it. A report of an operation still running (a
// VM left to another run's claim, a late task of an older attempt) publishes its VMs' outcomes
// so far and writes nothing.
func (a *Announcer) Report(ctx context.Context, nodeID, reclaimID string, attempt int) (int, error) {
	op, err := a.Store.GetOperation(ctx, nodeID, reclaimID)
	if err != nil {
		return 0, fmt.Errorf("read operation %s: %w", reclaimID, err)
	}
	res, err := a.report(ctx, *op, max(1, attempt))
	if err != nil {
		return 0, err
	}
	a.logger().InfoContext(ctx, "operation report published", "reclaim_id", reclaimID, "node", nodeID,
		"task_attempt", max(1, attempt), "attempt", op.CurrentAttempt(), "events", res.events, "ended", res.ended)
	return res.events, nil
}

// reportResult is what a report did: events published, whether its end write landed, and
// whether it failed at the publish.
type reportResult struct {
	events        int
	ended         bool
	publishFailed bool
}

// report reports the operation as read (see Report) for the task's attempt.
func (a *Announcer) report(ctx context.Context, op Operation, attempt int) (reportResult, error) {
	switch {
	case op.State == OpTerminating && op.Ended() && attempt == op.CurrentAttempt():
		return a.end(ctx, op)
	case op.State == OpCompleted || op.State == OpFailed:
		if a.Claims == nil || op.ReportClaimed {
			return reportResult{}, nil // ended by its report (or the reconciler's, before failing it)
		}
		// Ended by a writer that published nothing (a version whose rounds wrote the end):
		// its report, once.
		n, err := a.publishOnce(ctx, op, a.now())
		return reportResult{events: n, publishFailed: err != nil}, err
	default:
		events := OperationReport(op)
		if err := publish(ctx, a.Publisher, events); err != nil {
			return reportResult{publishFailed: true}, fmt.Errorf("publish report of %s: %w", op.ID, err)
		}
		return reportResult{events: len(events)}, nil
	}
}

// end publishes the report of a terminating operation whose every VM is final, as it will
// end, then writes its end, under the attempt's report claim.
func (a *Announcer) end(ctx context.Context, op Operation) (reportResult, error) {
	now := a.now()
	ended := op
	ended.State, ended.UpdatedAt = op.EndState(), now
	holder, ok, err := a.claim(ctx, op, now)
	if err != nil || !ok {
		return reportResult{}, err
	}
	events := OperationReport(ended)
	if err := publish(ctx, a.Publisher, events); err != nil {
		a.release(ctx, op, holder)
		return reportResult{publishFailed: true}, fmt.Errorf("publish report of %s: %w", op.ID, err)
	}
	err = a.Store.EndOperation(ctx, op, ended.State, now)
	if errors.Is(err, ErrConflict) {
		// Not terminating at this attempt any more: this write's own first try, whose answer
		// was lost (only the claim's holder ends it).
		a.logger().InfoContext(ctx, "operation ended since read", "reclaim_id", op.ID, "attempt", op.CurrentAttempt())
		return reportResult{events: len(events)}, nil
	}
	if err != nil {
		// Published but not ended: the retry publishes the same ids again and ends it.
		a.release(ctx, op, holder)
		return reportResult{events: len(events)}, fmt.Errorf("end operation %s as %s: %w", op.ID, ended.State, err)
	}
	a.logger().InfoContext(ctx, "reclaim operation ended", "reclaim_id", op.ID, "state", ended.State)
	if a.Metrics != nil {
		a.Metrics.OperationEnded(ctx, op, now)
	}
	return reportResult{events: len(events), ended: true}, nil
}

// publishOnce publishes the report of op (as it ends, or ended) under its attempt's report
// claim (with Claims) and returns how many events: none when another run holds the claim.
func (a *Announcer) publishOnce(ctx context.Context, op Operation, now time.Time) (int, error) {
	holder, ok, err := a.claim(ctx, op, now)
	if err != nil || !ok {
		return 0, err
	}
	events := OperationReport(op)
	if err := publish(ctx, a.Publisher, events); err != nil {
		a.release(ctx, op, holder)
		return 0, fmt.Errorf("publish report of %s: %w", op.ID, err)
	}
	return len(events), nil
}

// claim takes the report claim of op's attempt for a new holder, returned ("" without
// Claims: nothing to release); ok is false when another run holds it.
func (a *Announcer) claim(ctx context.Context, op Operation, now time.Time) (holder string, ok bool, err error) {
	if a.Claims == nil {
		return "", true, nil
	}
	holder = NewID()
	until := now.Add(DefaultClaimFor)
	if d, ok := ctx.Deadline(); ok {
		until = d.UTC().Add(ClaimMargin)
	}
	err = a.Claims.ClaimReport(ctx, op, holder, now, until)
	if errors.Is(err, ErrConflict) {
		a.logger().InfoContext(ctx, "operation report claimed by another run", "reclaim_id", op.ID, "attempt", op.CurrentAttempt())
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("claim report of %s: %w", op.ID, err)
	}
	return holder, true, nil
}

// release drops holder's report claim after a failure, so that the retry reports at once.
func (a *Announcer) release(ctx context.Context, op Operation, holder string) {
	if holder == "" {
		return
	}
	if err := a.Claims.ReleaseReport(ctx, op, holder); err != nil {
		a.logger().WarnContext(ctx, "release of a report claim failed", "reclaim_id", op.ID, "err", err)
	}
}

func (a *Announcer) now() time.Time {
	if a.Now != nil {
		return a.Now().UTC()
	}
	return time.Now().UTC()
}

func (a *Announcer) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

// publish publishes the events, if any and if there is a bus.
func publish(ctx context.Context, p Publisher, events []Event) error {
	if len(events) == 0 || p == nil {
		return nil
	}
	return p.Publish(ctx, events)
}
