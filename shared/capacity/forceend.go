package capacity

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ActionForceEnd is the audit action of an operator's force-end of a VM's termination.
const ActionForceEnd = "vm.force-end"

// ForceEndRequest ends the termination of one VM of a failed reclaim operation without its
// node's agent: an operator confirmed out of band that the VM is gone (the node was wiped,
// reimaged or decommissioned; its agent will never answer). Reason is required: it is the
// only record of that confirmation.
type ForceEndRequest struct {
	NodeID, ReservationID, ReclaimID, VMID string
	Reason, IdempotencyKey                 string
}

// ForceEndResult is the answer to ForceEnd: the operation after the call. Ended is set when
// this call recorded the last outcome the operation waited for (it is completed now).
type ForceEndResult struct {
	Operation Operation
	// Outcome is the VM's outcome after the call: force-ended (it was terminating and is now
	// terminated, its units free), already-gone (it had already left the live state without
	// an outcome), or the success recorded before (a repeat: nothing changed).
	Outcome  Outcome
	Ended    bool
	Replayed bool `json:"-"`
}

// ForceEnd is one force-end's writes, part of an OperatorCommit. Each conditions on what
// the decision read: the operation still failed at its attempt, the VM's outcome absent or a
// failure, the VM terminating for the operation at its version (or, VM nil, absent from
// the node's live VMs), and, when it does not complete the operation, the other VMs still
// without a success (a concurrent force-end need not move the node's version).
type ForceEnd struct {
	Operation Operation // as read, with its outcomes
	VMID      string
	// VM is the live VM as read (terminating for Operation), moved to the node's history as
	// terminated, which frees its units; nil when it was no longer live.
	VM      *VM
	Outcome VMOutcome
	// Complete: every other VM of the operation has a success outcome, so this one ends it:
	// completed, with an expiry (its outcomes' too) from now.
	Complete bool
}

// Validate checks the request on its own (the path ids are checked by the gate).
func (r ForceEndRequest) Validate() error {
	if strings.TrimSpace(r.Reason) == "" {
		return Errorf(CodeInvalidRequest, "reason is required: say how the VM was confirmed gone")
	}
	if err := validateReason(r.Reason); err != nil {
		return err
	}
	return ValidateIdempotencyKey(r.IdempotencyKey)
}

// AdmitForceEnd is ForceEnd's first gate, before the body is read: anyone but an operator
// holding node.manage, and any path id that names nothing, gets the one 404 of a missing
// operation.
func AdmitForceEnd(p Principal, nodeID, reservationID, opID, vmID string) error {
	if !p.CanOperate(PermNodeManage) || !ValidID(nodeID) || !ValidID(reservationID) || !ValidID(opID) || !ValidID(vmID) {
		return opNotFound()
	}
	return nil
}

func opNotFound() *Error { return Errorf(CodeNotFound, "reclaim operation not found") }

// ForceEnd ends a VM's termination that its agent cannot confirm: the VM moves from
// terminating to terminated (its units free), its outcome on the operation is force-ended
// with the reason, and when no other VM of the operation is left without a success the
// operation completes (and expires in time, like any completed one). Only for an operation
// that has failed: while its workflow runs, it may still terminate the VM
// (operation_running); a VM that is running, or terminating for another operation, is
// refused (invalid_transition). Repeating it changes nothing more.
func (s *Service) ForceEnd(ctx context.Context, p Principal, req ForceEndRequest, meta RequestMeta) (*ForceEndResult, error) {
	if err := AdmitForceEnd(p, req.NodeID, req.ReservationID, req.ReclaimID, req.VMID); err != nil {
		return nil, err
	}
	rec := s.opAudit(p, meta, ActionForceEnd, req.NodeID, req.ReservationID, nil, req.Reason)
	rec.ReclaimID, rec.VMID = req.ReclaimID, req.VMID
	key, kerr := keyed(p, meta, req.IdempotencyKey, fingerprintOf(ActionForceEnd, req))
	return runOp(s, ctx, opCall[ForceEndResult]{
		rec:     rec,
		invalid: cmp.Or(req.Validate(), kerr),
		key:     key,
		missing: opNotFound,
		decide: func(st *NodeState, audit *AuditRecord, now time.Time) (*OperatorCommit, *ForceEndResult, error) {
			op, err := s.Store.GetOperation(ctx, req.NodeID, req.ReclaimID)
			if ErrorCode(err) == CodeNotFound {
				return nil, nil, opNotFound()
			}
			if err != nil {
				return nil, nil, fmt.Errorf("read operation %s: %w", req.ReclaimID, err)
			}
			c, r, err := DecideForceEnd(st, op, req, now)
			if err == nil && c.ForceEnd != nil {
				audit.Terminated = []string{req.VMID}
				audit.UnitIDs = slices.Clone(op.Victim(req.VMID).UnitIDs)
			}
			return c, r, err
		},
	})
}

// DecideForceEnd decides a force-end on the node and the operation as read.
func DecideForceEnd(st *NodeState, op *Operation, req ForceEndRequest, now time.Time) (*OperatorCommit, *ForceEndResult, error) {
	if op.ReservationID != req.ReservationID || op.NodeID != req.NodeID {
		return nil, nil, opNotFound()
	}
	if !slices.Contains(op.VMIDs, req.VMID) {
		return nil, nil, Errorf(CodeNotFound, "VM %s is not one reclaim operation %s evicted", req.VMID, op.ID)
	}
	c := &OperatorCommit{Node: st.Node}
	if out, ok := op.Outcomes[req.VMID]; ok && out.Outcome != OutcomeFailed {
		// A success recorded before (by the agent, or an earlier force-end): nothing to do.
		return c, &ForceEndResult{Operation: *op, Outcome: out.Outcome}, nil
	}
	if op.State != OpFailed {
		return nil, nil, Errorf(CodeOperationRunning,
			"reclaim operation %s is %s: its workflow may still terminate VM %s; force-end only once it has failed", op.ID, op.State, req.VMID)
	}
	fe := &ForceEnd{Operation: *op, VMID: req.VMID,
		Outcome: VMOutcome{Outcome: OutcomeForceEnded, Reason: req.Reason, At: now, Attempt: op.CurrentAttempt()}}
	if i := slices.IndexFunc(st.VMs, func(v VM) bool { return v.ID == req.VMID }); i >= 0 {
		vm := st.VMs[i]
		if vm.State != VMTerminating || vm.ReclaimID != op.ID {
			return nil, nil, Errorf(CodeInvalidTransition,
				"VM %s is %s (reclaim %q), not terminating for reclaim operation %s: nothing to force-end", vm.ID, vm.State, vm.ReclaimID, op.ID)
		}
		fe.VM = &vm
	} else {
		// Not live any more (terminated, its outcome never recorded): only the outcome is owed.
		fe.Outcome.Outcome = OutcomeAlreadyGone
	}
	after := *op
	after.Outcomes = make(map[string]VMOutcome, len(op.Outcomes)+1)
	for id, o := range op.Outcomes {
		after.Outcomes[id] = o
	}
	after.Outcomes[req.VMID] = fe.Outcome
	after.UpdatedAt = now
	fe.Complete = true
	for _, id := range op.VMIDs {
		if o, ok := after.Outcomes[id]; !ok || o.Outcome == OutcomeFailed {
			fe.Complete = false
		}
	}
	if fe.Complete {
		after.State, after.Reason = OpCompleted, ""
	}
	c.ForceEnd, c.BumpNode = fe, fe.VM != nil // freed units: decisions that read them go again
	return c, &ForceEndResult{Operation: after, Outcome: fe.Outcome.Outcome, Ended: fe.Complete}, nil
}
