package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// Releases, placements, scheduled reclaims and reclaim operations: the jobs of the Quick start
// and of docs/operating.md beyond the operator's.

func releaseCmd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	units := fs.String("units", "", "idle exclusive unit ids to release, comma-separated")
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation", "units")
	if err != nil {
		return err
	}
	out, meta, err := c.Release(ctx, *node, *res, client.ReleaseRequest{UnitIDs: list(*units), Reason: *reason}, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		reservationTable(w, *out)
		fmt.Fprintf(w, "\nreleased to the spot market\t%s\n", join(list(*units)))
	})
}

func vmsPlace(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	vm := fs.String("vm", "", "the VM's id")
	org := fs.String("org", "", "the org the VM runs for")
	tier := fs.String("tier", "", "spot, reserved or on-demand")
	units := fs.String("units", "", "the unit ids it runs on, comma-separated")
	idem := fs.String("idempotency-key", "", "Idempotency-Key of the call")
	if err := a.parseFlags(fs, args, "node", "vm", "org", "tier", "units"); err != nil {
		return err
	}
	switch capacity.Tier(*tier) {
	case capacity.TierSpot, capacity.TierReserved, capacity.TierOnDemand:
	default:
		return usageErr(fs, "--tier must be spot, reserved or on-demand, not %q", *tier)
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	out, meta, err := c.PlaceVM(ctx, *node, client.PlaceRequest{VMID: *vm, OrgID: *org, Tier: *tier, UnitIDs: list(*units)}, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { vmTable(w, "placed", []wire.VMJSON{*out}) })
}

// scheduledFlags name one scheduled reclaim.
func scheduledFlags(fs *flag.FlagSet) (node, res, id *string) {
	node, res = reservationFlags(fs)
	return node, res, fs.String("id", "", "the scheduled reclaim's id (srcl_…, as reclaim --at and scheduled list print it)")
}

func scheduledGet(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := scheduledFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation", "id")
	if err != nil {
		return err
	}
	sr, meta, err := c.GetScheduledReclaim(ctx, *node, *res, *id)
	if err != nil {
		return err
	}
	if err := a.emit(meta, func(w io.Writer) { scheduledTable(w, *sr) }); err != nil {
		return err
	}
	if sr.ReclaimID != "" {
		fmt.Fprintf(a.info(), "its reclaim: %s\n", a.cmdline("reclaims", "get", "--node", shellQuote(*node), "--reservation", shellQuote(*res), "--reclaim", shellQuote(sr.ReclaimID)))
	}
	return nil
}

func scheduledCancel(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := scheduledFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation", "id")
	if err != nil {
		return err
	}
	sr, meta, err := c.CancelScheduledReclaim(ctx, *node, *res, *id)
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { scheduledTable(w, *sr) })
}

// operationFlags name one reclaim operation.
func operationFlags(fs *flag.FlagSet) (node, res, id *string) {
	node, res = reservationFlags(fs)
	return node, res, fs.String("reclaim", "", "the reclaim operation's id (the reclaim id reclaim prints)")
}

func reclaimsGet(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := operationFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation", "reclaim")
	if err != nil {
		return err
	}
	op, meta, err := c.GetReclaim(ctx, *node, *res, *id)
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { operationTable(w, *op) })
}

func reclaimsWait(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := operationFlags(fs)
	wait := fs.Duration("wait", 15*time.Minute, "how long to follow it (exit 5 if it runs out first)")
	if err := a.parseFlags(fs, args, "node", "reservation", "reclaim"); err != nil {
		return err
	}
	if *wait <= 0 {
		return usageErr(fs, "--wait must be positive")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	return a.follow(ctx, c, a.info(), *node, *res, *id, *wait, "")
}

func reclaimsRetry(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := operationFlags(fs)
	wait := fs.Duration("wait", 0, "then follow it this long (0: do not follow; print the command that does)")
	idem := fs.String("idempotency-key", "", "Idempotency-Key of the call")
	if err := a.parseFlags(fs, args, "node", "reservation", "reclaim"); err != nil {
		return err
	}
	if *wait < 0 {
		return usageErr(fs, "--wait must not be negative")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	op, meta, err := c.RetryReclaim(ctx, *node, *res, *id, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	if meta.Status == 200 {
		fmt.Fprintln(a.info(), "nothing to retry: every VM is terminated or gone")
		return a.emit(meta, func(w io.Writer) { operationTable(w, *op) })
	}
	if a.output != "json" || *wait == 0 { // with --wait under json, the operation as it ends says it all
		if err := a.emit(meta, func(w io.Writer) { operationTable(w, *op) }); err != nil {
			return err
		}
	}
	return a.follow(ctx, c, a.info(), *node, *res, *id, *wait, "")
}

func reclaimsForceEnd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res, id := operationFlags(fs)
	vm := fs.String("vm", "", "the VM whose termination ends (confirmed gone out of band)")
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation", "reclaim", "vm", "reason")
	if err != nil {
		return err
	}
	op, meta, err := c.ForceEndVM(ctx, *node, *res, *id, *vm, *reason, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { operationTable(w, *op) })
}

// operationTable prints a reclaim operation: each VM with its notice and outcome, or (the
// audience's view) the counts.
func operationTable(w io.Writer, op wire.OperationJSON) {
	fmt.Fprintf(w, "reclaim\t%s (reservation %s on %s)\n", op.ID, op.ReservationID, op.NodeID)
	state := op.State
	if op.Attempt > 1 {
		state += fmt.Sprintf(" (attempt %d)", op.Attempt)
	}
	fmt.Fprintf(w, "state\t%s\n", state)
	fmt.Fprintf(w, "units\t%s\n", join(op.UnitIDs))
	fmt.Fprintf(w, "created\t%s\n", dash(op.CreatedAt))
	fmt.Fprintf(w, "updated\t%s\n", dash(op.UpdatedAt))
	if op.Reason != "" {
		fmt.Fprintf(w, "reason\t%s\n", cell(op.Reason))
	}
	fmt.Fprintf(w, "progress\t%s\n", progressOf(&op))
	if op.VMCounts != nil {
		return
	}
	fmt.Fprintln(w, "\nVM\tOUTCOME\tAT\tNOTICE\tTERMINATE AFTER\tERROR OR REASON")
	for _, v := range op.VMs {
		notice, after := "-", "-"
		if v.Notice != nil {
			notice = v.Notice.State + atText(v.Notice.At)
			after = dash(v.Notice.TerminateAfter)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", v.VMID, v.Outcome, dash(v.At), cell(notice), after, dash(strings.TrimSpace(v.Error+" "+v.Reason)))
	}
}

// scheduledTable prints one scheduled reclaim.
func scheduledTable(w io.Writer, sr wire.ScheduledReclaimJSON) {
	fmt.Fprintf(w, "scheduled reclaim\t%s (reservation %s on %s)\n", sr.ID, sr.ReservationID, sr.NodeID)
	fmt.Fprintf(w, "at\t%s\n", sr.At)
	fmt.Fprintf(w, "state\t%s\n", sr.State)
	fmt.Fprintf(w, "units\t%s\n", join(sr.UnitIDs))
	fmt.Fprintf(w, "grace\t%ds\n", sr.GraceSeconds)
	fmt.Fprintf(w, "reason\t%s\n", dash(sr.Reason))
	fmt.Fprintf(w, "created\t%s by %s\n", dash(sr.CreatedAt), dash(sr.CreatedByOrgID))
	if sr.FiredAt != "" {
		fmt.Fprintf(w, "fired\t%s\n", sr.FiredAt)
	}
	if sr.CancelledAt != "" {
		fmt.Fprintf(w, "cancelled\t%s\n", sr.CancelledAt)
	}
	if sr.ReclaimID != "" {
		fmt.Fprintf(w, "reclaim id\t%s\n", sr.ReclaimID)
	}
	if sr.Code != "" {
		fmt.Fprintf(w, "outcome\t%s: %s\n", sr.Code, cell(sr.Detail))
	}
}
