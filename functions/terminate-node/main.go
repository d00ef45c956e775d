// Command terminate-node is the termination workflow's task: for one node of a reclaim
// operation it terminates the evicted VMs through the node's agent, records each outcome,
// and returns the VMs to retry in the next round.
//
// Environment: APP_ENV (the metrics' Environment); STATE_TABLE; AGENT_KEYS_KMS_KEY_ID, the KMS
// key the nodes' agent keys are sealed under (this function alone may open them);
// AGENT_MASTER_SECRET_ID, the Secrets Manager secret (name or ARN) the keys of nodes still at
// generation 0 are derived from (read at run time, cached 5 minutes, current and previous
// versions); AGENT_TIMEOUT; AGENT_ALLOW_HTTP=true only on the local stack, whose agents are
// plain http on loopback.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/kmsseal"
	"github.com/openrelay/capacity/shared/secrets"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("APP_ENV", "STATE_TABLE", "AGENT_MASTER_SECRET_ID", "AGENT_KEYS_KMS_KEY_ID"))
	timeout := config.Must(config.Duration("AGENT_TIMEOUT", 5*time.Second))
	allowHTTP := config.Must(allowHTTP(os.Getenv("AGENT_ALLOW_HTTP"), env["APP_ENV"]))
	cfg := config.Must(config.AWS(context.Background()))
	masters := secrets.New(secretsmanager.NewFromConfig(cfg), env["AGENT_MASTER_SECRET_ID"])
	client := &agent.Client{AllowHTTP: allowHTTP, Timeout: timeout}
	nodeAgent := agent.NodeAgent{Client: client, Opener: kmsseal.New(kms.NewFromConfig(cfg), env["AGENT_KEYS_KMS_KEY_ID"]), Legacy: agent.Derived{Masters: masters}}
	if allowHTTP {
		logger.Warn("AGENT_ALLOW_HTTP is set: plain http agent endpoints are accepted (local stack only)")
	}
	store := dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], "")
	store.Retention = config.Must(config.Duration("HISTORY_RETENTION", 0)) // per environment; 0: the default
	term := &capacity.Terminator{
		Store:   store,
		Agent:   nodeAgent,
		Logger:  logger,
		Metrics: emf.New(os.Stdout, env["APP_ENV"]),
	}
	lambda.Start(handler(term, logger))
}

// allowHTTP parses AGENT_ALLOW_HTTP: "true", or "" / "false". Anything else is refused, so a
// typo cannot quietly change the transport, and so is "true" outside APP_ENV local: the
// function then fails its init rather than talk to agents in clear.
func allowHTTP(v, appEnv string) (bool, error) {
	switch v {
	case "", "false":
		return false, nil
	case "true":
		if appEnv != "local" {
			return false, fmt.Errorf("environment variable AGENT_ALLOW_HTTP is true in env %q: plain http agents are allowed only in env local", appEnv)
		}
		return true, nil
	}
	return false, fmt.Errorf("environment variable AGENT_ALLOW_HTTP: %q, want true or false", v)
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
