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
	yes := fs.Bool("yes", false, "do not ask before the real reclaim")
	wait := fs.Duration("wait", 15*time.Minute, "how long to follow the termination")
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
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	// Progress and prompts go to stderr with --output json, so stdout stays JSON.
	info := a.io.out
	if a.output == "json" {
		info = a.io.err
	}
	req := client.ReclaimRequest{UnitIDs: list(*units), Reason: *reason, GraceSeconds: *grace, DryRun: true}

	plan, meta, err := a.planOf(ctx, c, info, *node, *res, &req, *count)
	if err != nil {
		return err
	}
	*units = strings.Join(req.UnitIDs, ",")
	etag := meta.ETag
	if etag == "" { // the header is the plan's ETag; the member says the same
		etag = plan.PlanETag
	}
	if etag != "" && !strings.HasPrefix(etag, `"`) && !strings.HasPrefix(etag, "W/") {
		etag = `"` + etag + `"`
	}
	fmt.Fprintln(info, "Plan (dry run, nothing changed yet):")
	if err := a.show(info, meta, func(w io.Writer) { planTable(w, *plan) }); err != nil {
		return err
	}
	if !*yes {
		ok, err := confirm(ctx, a.io.in, a.io.err, "Proceed? [y/N] ")
		if err != nil {
			if ctx.Err() != nil {
				return failed(exitFailed, errors.New("interrupted; nothing was reclaimed"))
			}
			return err
		}
		if !ok {
			return failed(exitFailed, errors.New("not confirmed; nothing changed"))
		}
	}

	req.DryRun = false
	opt := client.Options{IdempotencyKey: *idem, IfMatch: etag}
	if opt.IdempotencyKey == "" {
		opt.IdempotencyKey = "capacityctl-" + capacity.NewID()
	}
	// The key is printed before the call: if its answer never comes, the reclaim may still
	// have landed, and only this key finds out (a rerun with it replays the stored answer).
	resume := resumeCommand(*node, *res, *units, *reason, *grace, opt.IdempotencyKey)
	fmt.Fprintf(a.io.err, "Idempotency-Key %s (if no answer comes, resume with: %s)\n", opt.IdempotencyKey, resume)
	done, meta, err := a.reclaimWithRetry(ctx, c, *node, *res, req, opt)
	if err != nil {
		var pe *client.Error
		if !errors.As(err, &pe) || retryableWrite(context.Background(), err) {
			// No definite answer: the reclaim may or may not have been made.
			fmt.Fprintf(a.io.err, "capacityctl: no answer to the reclaim; it may have been made. Resume it (the same Idempotency-Key replays its answer if it landed):\n  %s\n", resume)
		}
		if errors.As(err, &pe) && pe.Code == "plan_changed" {
			fmt.Fprintln(a.io.err, "capacityctl: the plan changed since the dry run; nothing was reclaimed. The new plan:")
			if a.output == "json" {
				_ = printJSON(a.io.out, pe.Body)
			} else if pe.Plan != nil {
				if err := a.show(a.io.out, nil, func(w io.Writer) { planTable(w, *pe.Plan) }); err != nil {
					return err
				}
			}
			return &exitError{code: exitPlanChanged, err: errors.New("plan changed: review the new plan and run the reclaim again")}
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
	return a.follow(ctx, c, info, *node, *res, done.ReclaimID, *wait)
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

// reclaimWithRetry sends the real reclaim, retrying what retryableWrite allows with
// exponential backoff (from one poll interval, capped at maxBackoff of them).
func (a *app) reclaimWithRetry(ctx context.Context, c *client.Client, node, res string, req client.ReclaimRequest, opt client.Options) (*wire.ReservationJSON, *client.Meta, error) {
	pause := a.pollEvery
	for attempt := 1; ; attempt++ {
		out, meta, err := c.Reclaim(ctx, node, res, req, opt)
		if err == nil || !retryableWrite(ctx, err) {
			if err != nil && ctx.Err() != nil {
				return nil, nil, fmt.Errorf("reclaim interrupted: %w", ctx.Err())
			}
			return out, meta, err
		}
		if attempt == reclaimAttempts {
			return nil, nil, fmt.Errorf("reclaim: no answer after %d attempts: %w", reclaimAttempts, err)
		}
		fmt.Fprintf(a.io.err, "reclaim attempt %d of %d: %v; retrying in %s with the same Idempotency-Key\n", attempt, reclaimAttempts, err, pause)
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("reclaim interrupted: %w", ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, maxBackoff*a.pollEvery)
	}
}

// resumeCommand is the command line that resumes an interrupted reclaim: the same body (the
// API refuses a key reused with another one) and the same key, confirmed.
func resumeCommand(node, res, units, reason string, grace int, key string) string {
	args := []string{"capacityctl", "reclaim", "--node", shellQuote(node), "--reservation", shellQuote(res), "--units", shellQuote(units)}
	if reason != "" {
		args = append(args, "--reason", shellQuote(reason))
	}
	if grace != 0 {
		args = append(args, "--grace", fmt.Sprint(grace))
	}
	return strings.Join(append(args, "--idempotency-key", shellQuote(key), "--yes"), " ")
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

// follow polls the reclaim operation until every VM has an outcome, printing a line per change.
func (a *app) follow(ctx context.Context, c *client.Client, w io.Writer, node, res, id string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var last *progress
	var lastErr error
	for {
		op, meta, err := c.GetReclaim(ctx, node, res, id)
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("stopped following reclaim %s (its termination goes on): %w", id, ctx.Err())
		case err != nil && !retryableRead(ctx, err):
			return fmt.Errorf("follow reclaim %s: %w", id, err)
		case err != nil:
			lastErr = err
		default:
			p := progressOf(op)
			if last == nil || *last != p {
				fmt.Fprintln(w, p)
				last = &p
			}
			finished := p.pending == 0 || op.State == string(capacity.OpFailed) || op.State == string(capacity.OpCompleted)
			if finished {
				if a.output == "json" {
					if err := printJSON(a.io.out, meta.Body); err != nil {
						return err
					}
				}
				if p.failed > 0 || p.pending > 0 {
					why := op.Reason
					for _, v := range op.VMs {
						if v.Outcome == string(capacity.OutcomeFailed) && v.Error != "" {
							fmt.Fprintf(a.io.err, "  %s: %s\n", v.VMID, v.Error)
						}
					}
					return &exitError{code: exitVMsFailed, err: fmt.Errorf("reclaim %s is %s with %d VMs failed and %d without an outcome %s(re-drive: POST .../reclaims/%s/retry)",
						id, op.State, p.failed, p.pending, parens(why), id)}
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("reclaim %s still running after %s", id, wait)
			if lastErr != nil {
				msg += " (last error: " + lastErr.Error() + ")"
			}
			return failed(exitFailed, errors.New(msg))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following reclaim %s (its termination goes on): %w", id, ctx.Err())
		case <-time.After(a.pollEvery):
		}
	}
}

func parens(s string) string {
	if s == "" {
		return ""
	}
	return "(" + s + ") "
}
