// Package stepfn is the Step Functions side of the termination workflow: it starts an
// execution per reclaim operation and defines the JSON the state machine passes to the
// termination task (the state machine itself is defined in infra/).
package stepfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/smithy-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/trace"
)

// Steps of the termination workflow: the state machine's first state chooses on the input's
// step. The API and the reconciler start the first step; every later one (a round) comes
// from the termination-steps queue.
const (
	StepFirst = "first" // the notices, then the grace left as a message delay, or the first round
	StepRound = "round" // one round, then the report or the next round as a message delay
)

// MaxDelaySeconds is the longest per-message delay SQS takes.
const MaxDelaySeconds = 900

// Input is the first step's execution input: a reclaim operation's attempt that the execution
// runs, its node, its VMs still to terminate, and when their terminations may begin. Round is
// the first round, 0: each round's task reads its round from the state, which the input
// starts and every round's output (Task) carries on.
type Input struct {
	Step      string   `json:"step"`
	ReclaimID string   `json:"reclaimId"`
	NodeID    string   `json:"nodeId"`
	Attempt   int      `json:"attempt"`
	VMIDs     []string `json:"vmIds"`
	Round     int      `json:"round"`
	// TerminateAfter is RFC 3339 UTC in whole seconds, rounded up so that it is never before
	// the grace's end; always set: the commit time when there is no grace.
	TerminateAfter string `json:"terminateAfter"`
	// DueAt is when the first round may run, exactly (RFC 3339 UTC with nanoseconds): the
	// round's message carries it, and the steps function holds the round back until then.
	DueAt string `json:"dueAt"`
	// DelaySeconds is the grace left when the input was made, in whole seconds rounded up (at
	// most MaxDelaySeconds): above zero, the first round is sent as a message of that delay.
	DelaySeconds int `json:"delaySeconds"`
}

// Starter starts termination workflows on a state machine.
type Starter struct {
	Client          *sfn.Client
	StateMachineARN string
	// Now is the clock the grace left is measured by (nil: time.Now).
	Now func() time.Time
}

func (s *Starter) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

var _ capacity.WorkflowInspector = (*Starter)(nil)

// Start starts the execution of the operation's current attempt, named
// capacity.ExecutionName(op): Step Functions refuses a second execution of a name, so a
// retried start never runs an attempt twice (on a Standard machine; an Express one runs a
// name again). ExecutionAlreadyExists is taken as started: right for the API's start of a new
// name; the reconciler starts with StartChecked, which tells it apart.
func (s *Starter) Start(ctx context.Context, op capacity.Operation) error {
	err := s.StartChecked(ctx, op)
	if errors.Is(err, capacity.ErrExecutionExists) {
		return nil // started before: that execution carries the attempt
	}
	return err
}

// StartChecked starts the execution as Start does, but answers ExecutionAlreadyExists (an
// execution of the name closed, or ran with another input) with capacity.ErrExecutionExists,
// and a ThrottlingException the SDK's retryer gave up on (or its retry quota refused) with
// capacity.ErrThrottled, both wrapped. A repeated start of a running execution with the same
// input is a success, as Step Functions answers it.
func (s *Starter) StartChecked(ctx context.Context, op capacity.Operation) error {
	name := capacity.ExecutionName(op)
	input, err := json.Marshal(InputOf(op, s.now()))
	if err != nil {
		return fmt.Errorf("encode execution input of %s: %w", name, err)
	}
	_, err = s.Client.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(s.StateMachineARN),
		Name:            aws.String(name),
		Input:           aws.String(string(input)),
		TraceHeader:     traceHeader(ctx),
	})
	var (
		exists *types.ExecutionAlreadyExists
		quota  ratelimit.QuotaExceededError
		api    smithy.APIError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exists):
		return fmt.Errorf("start execution %s: %w: %w", name, capacity.ErrExecutionExists, err)
	case errors.As(err, &quota), errors.As(err, &api) && api.ErrorCode() == "ThrottlingException":
		return fmt.Errorf("start execution %s: %w: %w", name, capacity.ErrThrottled, err)
	}
	return fmt.Errorf("start execution %s: %w", name, err)
}

// maxTraceHeader is the longest TraceHeader StartExecution accepts.
const maxTraceHeader = 256

// traceHeader is the invocation's X-Ray trace header, so the execution joins the trace of
// the call that started it (the API's reclaim, or a reconciler run); nil when there is none
// or it is longer than StartExecution accepts (the execution then starts a trace of its own
// rather than fail to start).
func traceHeader(ctx context.Context) *string {
	h := trace.Header(ctx)
	if h == "" || len(h) > maxTraceHeader {
		return nil
	}
	return aws.String(h)
}

// ExecutionARN is the ARN of the named execution of a standard state machine:
// arn:<partition>:states:<region>:<account>:execution:<machine>:<name>.
func ExecutionARN(stateMachineARN, name string) (string, error) {
	const from, to = ":stateMachine:", ":execution:"
	if !strings.Contains(stateMachineARN, from) {
		return "", fmt.Errorf("not a state machine ARN: %q", stateMachineARN)
	}
	return strings.Replace(stateMachineARN, from, to, 1) + ":" + name, nil
}

// InputOf is the first step's input for an operation's current attempt at now: its VMs
// without an outcome final for that attempt, all on the operation's one node, and the grace
// left. Every time is rounded up, never down: a VM is never terminated before its grace ends.
func InputOf(op capacity.Operation, now time.Time) Input {
	after := op.TerminateAfter
	if after.IsZero() { // committed before grace existed: no wait
		after = op.CreatedAt
	}
	return Input{
		Step: StepFirst, ReclaimID: op.ID, NodeID: op.NodeID, Attempt: op.CurrentAttempt(), VMIDs: op.Unfinished(),
		TerminateAfter: ceilSecond(after).UTC().Format(time.RFC3339),
		DueAt:          FormatDueAt(after),
		DelaySeconds:   DelaySeconds(after.Sub(now)),
	}
}

// ceilSecond is t rounded up to a whole second.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}

// DelaySeconds is a message delay that holds a step back for left: whole seconds rounded up,
// zero for a time past, at most MaxDelaySeconds (a step due later is held back again).
func DelaySeconds(left time.Duration) int {
	if left <= 0 {
		return 0
	}
	return int(min(MaxDelaySeconds, (left+time.Second-1)/time.Second))
}

// FormatDueAt is a step's dueAt: RFC 3339 UTC with nanoseconds.
func FormatDueAt(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Phases of the operation-events task: the termination workflow's Notify and Report states
// send them (infra/termination.go), and the function runs one for each.
const (
	PhaseNotice = "notice" // before the grace period: the eviction notices
	PhaseReport = "report" // after the terminations: the outcomes and the operation's end
)

// Phases are every phase of the operation-events task.
var Phases = []string{PhaseNotice, PhaseReport}

// EventsTask is the operation-events task's input: which of a reclaim operation's events to
// publish, for the workflow attempt that runs it.
type EventsTask struct {
	Phase     string `json:"phase"`
	ReclaimID string `json:"reclaimId"`
	NodeID    string `json:"nodeId"`
	Attempt   int    `json:"attempt"`
}

// EventsResult is the operation-events task's output.
type EventsResult struct {
	Published int `json:"published"`
}

// Task is the termination task's input and, updated, its output: the state machine loops on
// it until Done.
type Task struct {
	ReclaimID    string   `json:"reclaimId"`
	NodeID       string   `json:"nodeId"`
	VMIDs        []string `json:"vmIds"` // in the output: the VMs to retry
	ExecutionARN string   `json:"executionArn"`
	Attempt      int      `json:"attempt"`
	Round        int      `json:"round"`
	MaxRounds    int      `json:"maxRounds"`
	// RetryWaitSeconds (input) is how long the workflow holds the next round back; DueAt
	// (output, when a round is left) is when that round may run, which its message carries.
	RetryWaitSeconds int    `json:"retryWaitSeconds,omitempty"`
	DueAt            string `json:"dueAt,omitempty"`
	// AgentNotices asks for the agents' eviction notices (the NotifyAgents state) instead of a
	// round. Not "phase": that names the operation-events task's phases.
	AgentNotices bool `json:"agentNotices,omitempty"`

	// Output only.
	Done        bool        `json:"done"`
	Terminated  []string    `json:"terminated,omitempty"`
	AlreadyGone []string    `json:"alreadyGone,omitempty"`
	Failed      []VMFailure `json:"failed,omitempty"`
	// Notices: in a notice phase's output, each VM's notice state.
	Notices map[string]string `json:"notices,omitempty"`
}

// VMFailure is a VM whose termination failed in the round.
type VMFailure struct {
	VMID  string `json:"vmId"`
	Error string `json:"error"`
	Final bool   `json:"final"`
}

// Domain returns the task as the domain's.
func (t Task) Domain() capacity.TerminationTask {
	return capacity.TerminationTask{
		ReclaimID: t.ReclaimID, NodeID: t.NodeID, VMIDs: t.VMIDs, ExecutionARN: t.ExecutionARN,
		Attempt: t.Attempt, Round: t.Round, MaxRounds: t.MaxRounds,
	}
}

// NoticeTask is the task as the domain's notice task.
func (t Task) NoticeTask() capacity.NoticeTask {
	return capacity.NoticeTask{ReclaimID: t.ReclaimID, NodeID: t.NodeID, Attempt: t.Attempt}
}

// RoundResult is the output of the round the task in ran, finished at now: TaskOf the report,
// and, when a round is left, when it may run (now plus the task's retry wait).
func RoundResult(in Task, r *capacity.TerminationReport, now time.Time) Task {
	out := TaskOf(r)
	out.RetryWaitSeconds = in.RetryWaitSeconds
	if !out.Done {
		out.DueAt = FormatDueAt(now.Add(time.Duration(in.RetryWaitSeconds) * time.Second))
	}
	return out
}

// TaskOf is the task's output for a round's report.
func TaskOf(r *capacity.TerminationReport) Task {
	n := r.Next
	out := Task{
		ReclaimID: n.ReclaimID, NodeID: n.NodeID, VMIDs: n.VMIDs, ExecutionARN: n.ExecutionARN,
		Attempt: n.Attempt, Round: n.Round, MaxRounds: n.MaxRounds,
		Done: r.Done, Terminated: r.Terminated, AlreadyGone: r.AlreadyGone,
	}
	for _, f := range r.Failed {
		out.Failed = append(out.Failed, VMFailure{VMID: f.VMID, Error: f.Error, Final: f.Final})
	}
	return out
}
