// Package stepfn is the Step Functions side of the termination workflow: it starts an
// execution per reclaim operation and defines the JSON the state machine passes to the
// per-node termination task (the state machine itself is defined in infra/).
package stepfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Input is an execution's input: the operation's victims grouped by node.
type Input struct {
	ReclaimID string      `json:"reclaimId"`
	Nodes     []NodeInput `json:"nodes"`
}

// NodeInput is one node's share of an operation.
type NodeInput struct {
	NodeID string   `json:"nodeId"`
	VMIDs  []string `json:"vmIds"`
}

// Starter starts termination workflows on a state machine.
type Starter struct {
	Client          *sfn.Client
	StateMachineARN string
}

var _ capacity.Workflow = (*Starter)(nil)

// Start starts the operation's execution, named by the operation id: Step Functions refuses
// a second execution of that name, so a retried or reconciled start never runs it twice.
func (s *Starter) Start(ctx context.Context, op capacity.Operation) error {
	input, err := json.Marshal(InputOf(op))
	if err != nil {
		return fmt.Errorf("encode execution input of %s: %w", op.ID, err)
	}
	_, err = s.Client.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(s.StateMachineARN),
		Name:            aws.String(op.ID),
		Input:           aws.String(string(input)),
	})
	var exists *types.ExecutionAlreadyExists
	if errors.As(err, &exists) {
		return nil // started before: that execution carries the operation
	}
	if err != nil {
		return fmt.Errorf("start execution %s: %w", op.ID, err)
	}
	return nil
}

// InputOf is the execution input for an operation. An operation lives on one node today;
// the input groups by node so a multi-node reclaim needs no new workflow.
func InputOf(op capacity.Operation) Input {
	return Input{ReclaimID: op.ID, Nodes: []NodeInput{{NodeID: op.NodeID, VMIDs: op.VMIDs}}}
}

// Task is the termination task's input and, updated, its output: the state machine loops on
// it until Done.
type Task struct {
	ReclaimID    string   `json:"reclaimId"`
	NodeID       string   `json:"nodeId"`
	VMIDs        []string `json:"vmIds"` // in the output: the VMs to retry
	ExecutionARN string   `json:"executionArn"`
	Round        int      `json:"round"`
	MaxRounds    int      `json:"maxRounds"`

	// Output only.
	Done        bool        `json:"done"`
	Terminated  []string    `json:"terminated,omitempty"`
	AlreadyGone []string    `json:"alreadyGone,omitempty"`
	Failed      []VMFailure `json:"failed,omitempty"`
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
		Round: t.Round, MaxRounds: t.MaxRounds,
	}
}

// TaskOf is the task's output for a round's report.
func TaskOf(r *capacity.TerminationReport) Task {
	n := r.Next
	out := Task{
		ReclaimID: n.ReclaimID, NodeID: n.NodeID, VMIDs: n.VMIDs, ExecutionARN: n.ExecutionARN,
		Round: n.Round, MaxRounds: n.MaxRounds,
		Done: r.Done, Terminated: r.Terminated, AlreadyGone: r.AlreadyGone,
	}
	for _, f := range r.Failed {
		out.Failed = append(out.Failed, VMFailure{VMID: f.VMID, Error: f.Error, Final: f.Final})
	}
	return out
}
