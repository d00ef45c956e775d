package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
)

// How a failure is told: a line on stderr (with the request id and the command to run next),
// and under --output json the problem document (RFC 9457) on stdout, in place of the answer,
// so that a script reading stdout always gets one JSON document. The API's problem is printed
// as it sent it; a failure of capacityctl's own (usage, no answer, a wait that ran out) gets a
// problem document of the same shape, with a code of its own.

// cliProblem is capacityctl's own problem document.
type cliProblem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status,omitempty"` // an API answer's status, when it was not a problem document
	Code   string `json:"code"`
	Detail string `json:"detail"`
	// ExitCode is capacityctl's exit code; Next the command to run next.
	ExitCode int    `json:"exitCode"`
	Next     string `json:"next,omitempty"`
}

// Codes of capacityctl's own problems, by exit code.
var cliCodes = map[int]string{
	exitFailed:      "failed",
	exitUsage:       "usage",
	exitPlanChanged: string(capacity.CodePlanChanged),
	exitVMsFailed:   "vms_failed",
	exitWaitExpired: "wait_expired",
}

// target is what the running command acts on: the next command suggested after a refusal
// names it.
type target struct {
	node, reservation, units, reclaim, scheduled string
}

// report prints err and returns the exit code.
func (a *app) report(err error) int {
	if err == nil {
		return exitOK
	}
	code, next, shown := exitFailed, "", false
	var usage func()
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err == nil {
			return ee.code
		}
		code, next, shown, usage = ee.code, ee.next, ee.shown, ee.usage
	}
	var pe *client.Error
	isProblem := errors.As(err, &pe)
	if next == "" && isProblem {
		next = a.nextAfter(pe)
	}
	if a.output == "json" && !shown {
		_ = a.printProblem(err, pe, code, next)
	}
	fmt.Fprintln(a.io.err, "capacityctl:", err) // with what it wraps: which call, how many attempts
	if isProblem && pe.RequestID != "" {
		fmt.Fprintf(a.io.err, "  request id: %s\n", pe.RequestID)
	}
	if next != "" {
		fmt.Fprintf(a.io.err, "  next: %s\n", next)
	}
	if usage != nil {
		usage()
	}
	return code
}

// printProblem prints the failure's problem document on stdout: the API's own when it sent
// one, else capacityctl's.
func (a *app) printProblem(err error, pe *client.Error, code int, next string) error {
	var ee *exitError
	own := ""
	if errors.As(err, &ee) {
		own = ee.problem
	}
	if own == "" && pe != nil && pe.Code != "" && json.Valid(pe.Body) {
		return printJSON(a.io.out, pe.Body)
	}
	p := cliProblem{Type: "about:blank", Code: orDefault(cliCodes[code], "failed"), Detail: err.Error(), ExitCode: code, Next: next}
	switch {
	case own != "":
		p.Code = own
	case pe != nil: // an answer that was not a problem document: API Gateway's own, say
		p.Code = orDefault(pe.Code, fmt.Sprintf("http_%d", pe.Status))
	}
	if pe != nil {
		p.Status = pe.Status
	}
	p.Title = "capacityctl: " + p.Code
	return printValue(a.io.out, p)
}

// nextAfter is the command to run after the API refused the running command, named with what
// it acts on; "" when the refusal says all there is.
func (a *app) nextAfter(pe *client.Error) string {
	t := a.target
	node, res := "--node "+shellQuote(t.node), "--reservation "+shellQuote(t.reservation)
	reservation := "capacityctl reservations get " + node + " " + res
	switch capacity.Code(pe.Code) {
	case capacity.CodeUnauthenticated:
		return "capacityctl --key <API key> " + a.cmdName() + " ... (or export CAPACITY_API_KEY=<API key>)"
	case capacity.CodeThrottled, capacity.CodeRateLimited, capacity.CodeConcurrentModification:
		return "the same command again, in a moment (nothing was applied)"
	}
	if t.node == "" {
		return ""
	}
	switch capacity.Code(pe.Code) {
	case capacity.CodePlanChanged:
		if t.units != "" && t.reservation != "" {
			return "capacityctl reclaim --dry-run " + node + " " + res + " --units " + shellQuote(t.units) + " (then reclaim again with what it shows)"
		}
	case capacity.CodeTopologyChanged:
		return "capacityctl nodes get " + node + " (then run it again with --expected-gen set to its topology gen)"
	case capacity.CodeOperationRunning:
		if t.reclaim != "" {
			return "capacityctl reclaims wait " + node + " " + res + " --reclaim " + shellQuote(t.reclaim)
		}
	case capacity.CodeScheduledReclaimFired:
		if t.scheduled != "" {
			return "capacityctl scheduled get " + node + " " + res + " --id " + shellQuote(t.scheduled) + " (it has run: its OUTCOME names the reclaim)"
		}
	case capacity.CodeScheduledReclaimLimit:
		return "capacityctl scheduled list " + node + " " + res + " (cancel one with capacityctl scheduled cancel)"
	case capacity.CodeUnitsNotReserved, capacity.CodeUnitsInUse, capacity.CodeUnitsUnavailable,
		capacity.CodeInsufficientUnits, capacity.CodeUnknownUnits:
		// The unit map says which units are in which state, under which reservation and VM.
		return "capacityctl nodes describe " + node + " (each unit's state, reservation and VM)"
	case capacity.CodeReservationNotActive, capacity.CodeOutsideTerm:
		if t.reservation != "" {
			return reservation
		}
		return "capacityctl nodes get " + node
	case capacity.CodeNotFound:
		// A reclaim id mistyped, or from another reservation: the reservation's list has them.
		if t.reclaim != "" && t.reservation != "" {
			return "capacityctl reclaims list " + node + " " + res + " (its reclaim operations, newest first)"
		}
	case capacity.CodeIdempotencyKeyReused:
		return "the first call's command again, unchanged (or drop --idempotency-key to make a new call)"
	}
	return ""
}

func (a *app) cmdName() string {
	if a.cmd == nil {
		return "<command>"
	}
	return a.cmd.name()
}

// cmdline is a capacityctl command line that runs as this one does: args, then the global
// flags that were given to this run (never the key).
func (a *app) cmdline(args ...string) string {
	out := append([]string{"capacityctl"}, args...)
	for _, g := range []struct{ name, v string }{{"--endpoint", a.endpoint}, {"--outputs", a.outputsFile}, {"--stack", a.stack}} {
		if g.v != "" {
			out = append(out, g.name, shellQuote(g.v))
		}
	}
	if a.output == "json" {
		out = append(out, "-o", "json")
	}
	return strings.Join(out, " ")
}
