// Command terminate-node is the termination workflow's task: for one node of a reclaim
// operation it terminates the evicted VMs through the node's agent, records each outcome,
// and returns the VMs to retry in the next round.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("STATE_TABLE", "AGENT_SECRET"))
	timeout := config.Must(config.Duration("AGENT_TIMEOUT", 5*time.Second))
	cfg := config.Must(config.AWS(context.Background()))
	term := &capacity.Terminator{
		Store:  dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], ""),
		Agent:  agentClient{&agent.Client{Secret: []byte(env["AGENT_SECRET"]), Timeout: timeout}},
		Logger: logger,
	}
	lambda.Start(handler(term, logger))
}

// handler runs one round. A returned error is a platform fault (Step Functions retries the
// task); the agent's failures are in the output, for the state machine to loop on.
func handler(term *capacity.Terminator, logger *slog.Logger) func(context.Context, stepfn.Task) (stepfn.Task, error) {
	return func(ctx context.Context, in stepfn.Task) (stepfn.Task, error) {
		report, err := term.Run(ctx, in.Domain())
		if err != nil {
			return stepfn.Task{}, fmt.Errorf("terminate VMs of %s on node %s: %w", in.ReclaimID, in.NodeID, err)
		}
		out := stepfn.TaskOf(report)
		logger.InfoContext(ctx, "termination round", "reclaim_id", in.ReclaimID, "node", in.NodeID, "round", in.Round,
			"terminated", out.Terminated, "already_gone", out.AlreadyGone, "failed", len(out.Failed), "done", out.Done)
		return out, nil
	}
}

// agentClient adapts the node-agent client to the domain's Agent.
type agentClient struct{ c *agent.Client }

func (a agentClient) Terminate(ctx context.Context, endpoint, vmID string) (bool, error) {
	res, err := a.c.Terminate(ctx, endpoint, vmID)
	return res.AlreadyGone, err
}
