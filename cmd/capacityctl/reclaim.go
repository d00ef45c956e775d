package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// reclaimAttempts bounds the real call's attempts while no definite answer comes (no answer
// at all, a per-request timeout, API Gateway's 429/502/503/504, the API's throttled or
// concurrent_modification). Every attempt carries the same Idempotency-Key, so one whose
// predecessor landed replays the stored answer instead of reclaiming again (If-Match is not
// part of the request's fingerprint, so a replay is answered whatever the plan is now).
const reclaimAttempts = 6

// maxBackoff caps the pause between attempts, in poll intervals (1s each by default).
const maxBackoff = 16

func reclaimCmd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	units := fs.String("units", "", "unit ids to reclaim, comma-separated")
	count := fs.Int("count", 0, "reclaim this many units, chosen by the service, least disruption first (instead of --units)")
	reason := fs.String("reason", "", "why (kept in the audit trail)")
	grace := fs.Int("grace", 0, "seconds the evicted VMs get before their termination (0..120)")
	dryRun := fs.Bool("dry-run", false, "show the plan (the VMs it would terminate and skip, and its ETag) and change nothing")
	at := fs.String("at", "", "schedule the reclaim for this time instead (RFC 3339, or a duration from now such as 2h): its plan is decided when it fires")
	yes := fs.Bool("yes", false, "do not ask before the real reclaim")
	wait := fs.Duration("wait", 15*time.Minute, "how long to follow the termination (0: do not follow; print the command that does)")
	idem := fs.String("idempotency-key", "", "Idempotency-Key of the real call: pass the one an interrupted reclaim printed to resume it (default: a new one)")
	if err := a.parseFlags(fs, args, "node", "reservation"); err != nil {
		return err
	}
	if (strings.TrimSpace(*units) == "") == (*count == 0) {
		return usageErr(fs, "give --units or --count, one of them")
	}
	if *count < 0 || *count > capacity.MaxUnits {
		return usageErr(fs, "--count must be 1..%d", capacity.MaxUnits)
	}
	if *grace < 0 || *grace > 120 {
		return usageErr(fs, "--grace must be 0..120 seconds")
	}
	if *wait < 0 {
		return usageErr(fs, "--wait must not be negative")
	}
	if *at != "" {
		if *dryRun {
			return usageErr(fs, "--dry-run or --at, not both: a scheduled reclaim's plan is made when it fires")
		}
		if *count != 0 {
			return usageErr(fs, "--at needs --units: a count is planned against the units' state when it is asked, not when the reclaim fires")
		}
		when, err := parseExpiry(*at, a.now())
		if err != nil {
			return usageErr(fs, "--at: %v", err)
		}
		c, err := a.client(ctx)
		if err != nil {
			return err
		}
		return a.scheduleReclaim(ctx, c, *node, *res, client.ScheduleRequest{UnitIDs: list(*units), At: when.Format(time.RFC3339), Reason: *reason, GraceSeconds: *grace}, *idem)
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	// Progress and prompts go to stderr with --output json, so stdout stays JSON.
	info := a.info()
	req := client.ReclaimRequest{UnitIDs: list(*units), Reason: *reason, GraceSeconds: *grace, DryRun: true}

	plan, meta, err := a.planOf(ctx, c, info, *node, *res, &req, *count)
	if err != nil {
		return err
	}
	*units = strings.Join(req.UnitIDs, ",")
	a.target.units = *units
	etag := meta.ETag
	if etag == "" { // the header is the plan's ETag; the member says the same
		etag = plan.PlanETag
	}
	if etag != "" && !strings.HasPrefix(etag, `"`) && !strings.HasPrefix(etag, "W/") {
		etag = `"` + etag + `"`
	}
	if *dryRun {
		if err := a.emit(meta, func(w io.Writer) { planTable(w, *plan) }); err != nil {
			return err
		}
		fmt.Fprintf(info, "dry run: nothing changed. To reclaim: %s\n", a.reclaimCommand(*node, *res, *units, *reason, *grace, ""))
		return nil
	}
	fmt.Fprintln(info, "Plan (dry run, nothing changed yet):")
	if err := a.show(info, meta, func(w io.Writer) { planTable(w, *plan) }); err != nil {
		return err
	}
	if !*yes {
		ok, err := confirm(ctx, a.io.in, a.io.err, "Proceed? [y/N] ")
		if err != nil {
			if ctx.Err() != nil {
				return &exitError{code: exitFailed, err: errors.New("interrupted; nothing was reclaimed"), problem: "interrupted"}
			}
			return err
		}
		if !ok {
			return &exitError{code: exitFailed, err: errors.New("not confirmed; nothing changed"), problem: "not_confirmed"}
		}
	}

	req.DryRun = false
	opt := client.Options{IdempotencyKey: *idem, IfMatch: etag}
	if opt.IdempotencyKey == "" {
		opt.IdempotencyKey = "capacityctl-" + capacity.NewID()
	}
	// The key is printed before the call: if its answer never comes, the reclaim may still
	// have landed, and only this key finds out (a rerun with it replays the stored answer).
	resume := a.reclaimCommand(*node, *res, *units, *reason, *grace, opt.IdempotencyKey)
	fmt.Fprintf(a.io.err, "Idempotency-Key %s (if no answer comes, resume with: %s)\n", opt.IdempotencyKey, resume)
	done, meta, err := withRetry(ctx, a, "reclaim", func() (*wire.ReservationJSON, *client.Meta, error) {
		return c.Reclaim(ctx, *node, *res, req, opt)
	})
	if err != nil {
		var pe *client.Error
		if !errors.As(err, &pe) || retryableWrite(context.Background(), err) {
			// No definite answer: the reclaim may or may not have been made.
			fmt.Fprintf(a.io.err, "capacityctl: no answer to the reclaim; it may have been made. Resume it (the same Idempotency-Key replays its answer if it landed):\n  %s\n", resume)
			return &exitError{code: exitFailed, err: err, problem: "no_answer", next: resume}
		}
		if pe.Code == string(capacity.CodePlanChanged) {
			fmt.Fprintln(a.io.err, "capacityctl: the plan changed since the dry run; nothing was reclaimed. The new plan:")
			if a.output != "json" && pe.Plan != nil { // under json, the problem printed carries it
				if err := a.show(a.io.out, nil, func(w io.Writer) { planTable(w, *pe.Plan) }); err != nil {
					return err
				}
			}
			return &exitError{code: exitPlanChanged, err: fmt.Errorf("plan changed: review the new plan and run the reclaim again: %w", err)}
		}
		return err
	}
	if a.output == "json" {
		if err := printJSON(a.io.out, meta.Body); err != nil {
			return err
		}
	} else {
		if err := a.show(info, nil, func(w io.Writer) {
			fmt.Fprintf(w, "reclaimed\t%s on %s\n", done.ID, done.NodeID)
			fmt.Fprintf(w, "terminating\t%s\n", join(derefs(done.Terminated)))
			fmt.Fprintf(w, "skipped\t%s\n", join(derefs(done.Skipped)))
			fmt.Fprintf(w, "reclaim id\t%s\n", dash(done.ReclaimID))
			if done.TerminateAfter != "" {
				fmt.Fprintf(w, "termination from\t%s\n", done.TerminateAfter)
			}
			fmt.Fprintf(w, "idempotency key\t%s\n", opt.IdempotencyKey)
		}); err != nil {
			return err
		}
	}
	if done.ReclaimID == "" {
		fmt.Fprintln(info, "nothing to terminate")
		return nil
	}
	a.target.reclaim = done.ReclaimID
	return a.follow(ctx, c, info, *node, *res, done.ReclaimID, *wait, done.TerminateAfter)
}

// info is where progress, prompts and hints go: stdout, or stderr with --output json so that
// stdout stays JSON.
func (a *app) info() io.Writer {
	if a.output == "json" {
		return a.io.err
	}
	return a.io.out
}

// scheduleReclaim schedules a reclaim and prints it with the command that cancels it.
func (a *app) scheduleReclaim(ctx context.Context, c *client.Client, node, res string, req client.ScheduleRequest, idem string) error {
	opt := client.Options{IdempotencyKey: idem}
	if opt.IdempotencyKey == "" {
		opt.IdempotencyKey = "capacityctl-" + capacity.NewID()
	}
	// Again with the time it resolved to (a duration would name a later one, another body,
	// which the API refuses under a used key).
	args := []string{"reclaim", "--node", shellQuote(node), "--reservation", shellQuote(res), "--units", shellQuote(strings.Join(req.UnitIDs, ",")), "--at", req.At}
	if req.Reason != "" {
		args = append(args, "--reason", shellQuote(req.Reason))
	}
	if req.GraceSeconds != 0 {
		args = append(args, "--grace", fmt.Sprint(req.GraceSeconds))
	}
	again := a.cmdline(append(args, "--idempotency-key", shellQuote(opt.IdempotencyKey))...)
	fmt.Fprintf(a.io.err, "Idempotency-Key %s (if no answer comes, run: %s; it finds the reclaim it scheduled)\n", opt.IdempotencyKey, again)
	sr, meta, err := withRetry(ctx, a, "schedule", func() (*wire.ScheduledReclaimJSON, *client.Meta, error) {
		return c.ScheduleReclaim(ctx, node, res, req, opt)
	})
	var pe *client.Error
	if err != nil && (!errors.As(err, &pe) || retryableWrite(context.Background(), err)) {
		return &exitError{code: exitFailed, err: err, problem: "no_answer", next: again}
	}
	if err != nil {
		return err
	}
	a.target.scheduled = sr.ID
	if err := a.emit(meta, func(w io.Writer) { scheduledTable(w, *sr) }); err != nil {
		return err
	}
	fmt.Fprintf(a.info(), "cancel it before %s with: %s\n", sr.At, a.cmdline("scheduled", "cancel", "--node", shellQuote(node), "--reservation", shellQuote(res), "--id", shellQuote(sr.ID)))
	return nil
}

// planOf answers the plan the reclaim will carry out: with count, the service's choice of
// units (req.UnitIDs becomes it), else the dry run of req.
func (a *app) planOf(ctx context.Context, c *client.Client, info io.Writer, node, res string, req *client.ReclaimRequest, count int) (*wire.ReservationJSON, *client.Meta, error) {
	if count == 0 {
		plan, meta, err := c.Reclaim(ctx, node, res, *req, client.Options{})
		if err != nil {
			return nil, nil, fmt.Errorf("dry run: %w", err)
		}
		return plan, meta, nil
	}
	chosen, meta, err := c.PlanReclaim(ctx, node, res, client.ReclaimPlanRequest{Count: count, Reason: req.Reason, GraceSeconds: req.GraceSeconds})
	if err != nil {
		return nil, nil, fmt.Errorf("plan a reclaim of %d units: %w", count, err)
	}
	req.UnitIDs = chosen.UnitIDs
	fmt.Fprintf(info, "The service chose %d units, least disruption first: %s\n", count, join(chosen.UnitIDs))
	return &chosen.ReservationJSON, meta, nil
}

// show prints a table to w (the plan goes to stderr with --output json); with --output json
// and a meta it prints the answer's JSON to stdout instead.
func (a *app) show(w io.Writer, meta *client.Meta, table func(io.Writer)) error {
	if a.output == "json" {
		if meta != nil {
			return printJSON(a.io.out, meta.Body)
		}
		return nil
	}
	tw := newTable(w)
	table(tw)
	return tw.Flush()
}

// confirm asks question on out and reads one line of in: y or yes (any case) is yes. The
// line is read in a goroutine so that Ctrl-C (ctx done) aborts the wait: the signal is caught
// for the context, and a read of a terminal does not return on it.
func confirm(ctx context.Context, in io.Reader, out io.Writer, question string) (bool, error) {
	fmt.Fprint(out, question)
	type answer struct {
		line string
		err  error
	}
	got := make(chan answer, 1) // buffered: an abandoned read does not block its goroutine's send
	go func() {
		line, err := bufio.NewReader(in).ReadString('\n')
		got <- answer{line, err}
	}()
	var line string
	var err error
	select {
	case <-ctx.Done():
		fmt.Fprintln(out)
		return false, ctx.Err()
	case ans := <-got:
		line, err = ans.line, ans.err
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read the answer: %w", err)
	}
	if errors.Is(err, io.EOF) && line == "" {
		fmt.Fprintln(out)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// retryableWrite reports whether the real reclaim may be sent again with its Idempotency-Key
// while ctx is alive: no answer (a network error or the per-request timeout, which Go reports
// as context.DeadlineExceeded of the request, not of ctx), API Gateway's own 429/502/503/504,
// or the API's throttled and concurrent_modification.
func retryableWrite(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pe *client.Error
	if errors.As(err, &pe) {
		return pe.Code == string(capacity.CodeThrottled) || pe.Code == string(capacity.CodeConcurrentModification) || pe.FromGateway()
	}
	return true
}

// retryableRead reports whether a poll may be repeated: a read changes nothing, so every
// failure is retried while ctx is alive except those no retry mends (401, 403, 404).
func retryableRead(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pe *client.Error
	if errors.As(err, &pe) {
		switch pe.Status {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			return false
		}
	}
	return true
}

// withRetry sends a write (what names it) whose attempts all carry one Idempotency-Key,
// retrying what retryableWrite allows with exponential backoff (from one poll interval, capped
// at maxBackoff of them).
func withRetry[T any](ctx context.Context, a *app, what string, send func() (*T, *client.Meta, error)) (*T, *client.Meta, error) {
	pause := a.pollEvery
	for attempt := 1; ; attempt++ {
		out, meta, err := send()
		if err == nil || !retryableWrite(ctx, err) {
			if err != nil && ctx.Err() != nil {
				return nil, nil, fmt.Errorf("%s interrupted: %w", what, ctx.Err())
			}
			return out, meta, err
		}
		if attempt == reclaimAttempts {
			return nil, nil, fmt.Errorf("%s: no answer after %d attempts: %w", what, reclaimAttempts, err)
		}
		fmt.Fprintf(a.io.err, "%s attempt %d of %d: %v; retrying in %s with the same Idempotency-Key\n", what, attempt, reclaimAttempts, err, pause)
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%s interrupted: %w", what, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, maxBackoff*a.pollEvery)
	}
}

// reclaimCommand is the command line of a reclaim: with key, the one that resumes an
// interrupted reclaim (the same body, which the API demands of a reused key, and the same
// key, confirmed); without, the one that runs a dry run's plan.
func (a *app) reclaimCommand(node, res, units, reason string, grace int, key string) string {
	args := []string{"reclaim", "--node", shellQuote(node), "--reservation", shellQuote(res), "--units", shellQuote(units)}
	if reason != "" {
		args = append(args, "--reason", shellQuote(reason))
	}
	if grace != 0 {
		args = append(args, "--grace", fmt.Sprint(grace))
	}
	if key != "" {
		args = append(args, "--idempotency-key", shellQuote(key), "--yes")
	}
	return a.cmdline(args...)
}

// shellQuote quotes s for a POSIX shell unless it is plainly safe.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:/=@+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// progress counts an operation's VMs by outcome.
type progress struct{ total, terminated, gone, failed, pending int }

func (p progress) done() int { return p.terminated + p.gone + p.failed }

func (p progress) String() string {
	return fmt.Sprintf("%d/%d VMs done: %d terminated, %d already-gone, %d failed", p.done(), p.total, p.terminated, p.gone, p.failed)
}

func progressOf(op *wire.OperationJSON) progress {
	if op.VMCounts != nil { // the audience's redacted view
		c := op.VMCounts
		return progress{total: c.Pending + c.Terminated + c.AlreadyGone + c.Failed, terminated: c.Terminated, gone: c.AlreadyGone, failed: c.Failed, pending: c.Pending}
	}
	var p progress
	for _, v := range op.VMs {
		p.total++
		switch v.Outcome {
		case string(capacity.OutcomeTerminated):
			p.terminated++
		case string(capacity.OutcomeAlreadyGone), string(capacity.OutcomeForceEnded):
			p.gone++
		case string(capacity.OutcomeFailed):
			p.failed++
		default:
			p.pending++
		}
	}
	return p
}

// follow polls the reclaim operation until every VM has an outcome, printing a line per
// change: each eviction notice as it is delivered, a countdown through the grace (from
// terminateAfter, the reclaim's answer's, else the notices'), each VM's outcome and the
// count. It exits 4 if a VM failed, and 5 (with the command that follows it again) if wait
// runs out first.
func (a *app) follow(ctx context.Context, c *client.Client, w io.Writer, node, res, id string, wait time.Duration, terminateAfter string) error {
	again := a.cmdline("reclaims", "wait", "--node", shellQuote(node), "--reservation", shellQuote(res), "--reclaim", shellQuote(id))
	if wait == 0 {
		fmt.Fprintf(w, "not following it (--wait 0); follow it with: %s\n", again)
		return nil
	}
	deadline := a.now().Add(wait)
	wt := newWatch(terminateAfter)
	wt.live = a.liveFor(w)
	defer wt.settle()
	var lastErr error
	for {
		op, meta, err := c.GetReclaim(ctx, node, res, id)
		switch {
		case err != nil && ctx.Err() != nil:
			return &exitError{code: exitFailed, err: fmt.Errorf("stopped following reclaim %s (its termination goes on): %w", id, ctx.Err()), problem: "interrupted", next: again}
		case err != nil && !retryableRead(ctx, err):
			return fmt.Errorf("follow reclaim %s: %w", id, err)
		case err != nil:
			lastErr = err
		default:
			wt.report(w, op, a.now())
			p := progressOf(op)
			finished := p.pending == 0 || op.State == string(capacity.OpFailed) || op.State == string(capacity.OpCompleted)
			if finished {
				if a.output == "json" {
					if err := printJSON(a.io.out, meta.Body); err != nil {
						return err
					}
				}
				if p.failed > 0 || p.pending > 0 {
					for _, v := range op.VMs {
						if v.Outcome == string(capacity.OutcomeFailed) && v.Error != "" {
							fmt.Fprintf(a.io.err, "  %s: %s\n", v.VMID, v.Error)
						}
					}
					return &exitError{code: exitVMsFailed, shown: a.output == "json",
						err: fmt.Errorf("reclaim %s is %s with %d VMs failed and %d without an outcome %s(re-drive it; an operator may force-end a VM confirmed gone: capacityctl reclaims force-end)",
							id, op.State, p.failed, p.pending, parens(op.Reason)),
						next: a.cmdline("reclaims", "retry", "--node", shellQuote(node), "--reservation", shellQuote(res), "--reclaim", shellQuote(id))}
				}
				return nil
			}
		}
		if !a.now().Before(deadline) {
			msg := fmt.Sprintf("reclaim %s still running after %s; its termination goes on", id, wait)
			if lastErr != nil {
				msg += " (last error: " + lastErr.Error() + ")"
			}
			return &exitError{code: exitWaitExpired, err: errors.New(msg), next: again}
		}
		select {
		case <-ctx.Done():
			return &exitError{code: exitFailed, err: fmt.Errorf("stopped following reclaim %s (its termination goes on): %w", id, ctx.Err()), problem: "interrupted", next: again}
		case <-time.After(a.pollEvery):
		}
	}
}

// watch is what following an operation has told so far.
type watch struct {
	terminateAfter time.Time
	noticed, ended map[string]bool
	last           *progress
	step           int64 // the countdown's last step printed, in seconds (0: none yet)
	graceOver      bool
	// live, when the lines go to a terminal, is it unescaped: the countdown is then one line
	// redrawn in place every poll (drawn says it is on screen) rather than a line per step.
	live  io.Writer
	drawn bool
}

func newWatch(terminateAfter string) *watch {
	wt := &watch{noticed: map[string]bool{}, ended: map[string]bool{}}
	wt.terminateAfter, _ = time.Parse(time.RFC3339, terminateAfter)
	return wt
}

// eraseLine clears the line the cursor is on: carriage return, then erase to its end.
const eraseLine = "\r\x1b[K"

// settle erases a countdown left on screen.
func (wt *watch) settle() {
	if wt.drawn {
		_, _ = io.WriteString(wt.live, eraseLine)
		wt.drawn = false
	}
}

// report prints what changed since the last poll.
func (wt *watch) report(w io.Writer, op *wire.OperationJSON, now time.Time) {
	wt.settle()
	for _, v := range op.VMs {
		if v.Notice == nil || wt.noticed[v.VMID] {
			continue
		}
		wt.noticed[v.VMID] = true
		n := v.Notice
		if wt.terminateAfter.IsZero() {
			wt.terminateAfter, _ = time.Parse(time.RFC3339, n.TerminateAfter)
		}
		switch n.State {
		case "delivered":
			fmt.Fprintf(w, "notice delivered to %s at %s (terminated from %s)\n", v.VMID, n.At, n.TerminateAfter)
		case "unsupported":
			fmt.Fprintf(w, "notice to %s not delivered: its agent predates eviction notices (terminated from %s all the same)\n", v.VMID, n.TerminateAfter)
		case "unknown-vm":
			fmt.Fprintf(w, "notice to %s not delivered: its agent does not know the VM\n", v.VMID)
		default:
			fmt.Fprintf(w, "notice to %s %s%s\n", v.VMID, n.State, colonText(n.Error))
		}
	}
	for _, v := range op.VMs {
		if v.Outcome == "" || v.Outcome == "pending" || wt.ended[v.VMID] {
			continue
		}
		wt.ended[v.VMID] = true
		fmt.Fprintf(w, "%s %s%s%s\n", v.VMID, v.Outcome, atText(v.At), colonText(orDefault(v.Error, v.Reason)))
	}
	p := progressOf(op)
	if wt.last == nil || *wt.last != p {
		fmt.Fprintln(w, p)
		wt.last = &p
	}
	wt.countdown(w, p, now)
}

// countdown tells the time left in the grace while VMs wait for their termination: on a
// terminal one line redrawn every poll, elsewhere a line per step (every 10 s, then every
// second of the last 10), so that a log or a pipe reads the same whatever the poll interval.
func (wt *watch) countdown(w io.Writer, p progress, now time.Time) {
	if wt.terminateAfter.IsZero() || p.pending == 0 {
		return
	}
	left := wt.terminateAfter.Sub(now)
	if left <= 0 {
		if wt.step > 0 && !wt.graceOver {
			wt.graceOver = true
			fmt.Fprintln(w, "grace over: terminating")
		}
		return
	}
	secs := int64((left + time.Second - 1) / time.Second)
	line := fmt.Sprintf("grace: %ds left before termination (at %s)", secs, wt.terminateAfter.UTC().Format(time.RFC3339))
	if wt.live != nil {
		wt.step = secs
		_, _ = io.WriteString(wt.live, eraseLine+line)
		wt.drawn = true
		return
	}
	step := secs
	if secs > 10 {
		step = (secs + 9) / 10 * 10
	}
	if step != wt.step {
		wt.step = step
		fmt.Fprintf(w, "grace: %ds left before termination (at %s)\n", step, wt.terminateAfter.UTC().Format(time.RFC3339))
	}
}

func atText(t string) string {
	if t == "" {
		return ""
	}
	return " at " + t
}

func colonText(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func parens(s string) string {
	if s == "" {
		return ""
	}
	return "(" + s + ") "
}
