// Command terminate-node is the termination workflow's task: for one node of a reclaim
// operation it terminates the evicted VMs through the node's agent, records each outcome,
// and returns the VMs to retry in the next round. Asked for agentNotices, before the grace period,
// it sends the operation's eviction notices to the node's agent instead, cut off at the
// operation's terminateAfter so that the termination never waits on a slow agent, and
// records each one's fate.
//
// A node's KMS-sealed key is opened with KMS once per key generation: then resealed under a key
// derived from the agent master secret and stored on the node (agent.Resealer), where every
// later round, in any instance, opens it without KMS.
//
// Environment: APP_ENV (the metrics' Environment); STATE_TABLE; AGENT_KEYS_KMS_KEY_ID, the KMS
// key the nodes' agent keys are sealed under (this function alone may open them);
// AGENT_MASTER_SECRET_ID, the Secrets Manager secret (name or ARN) the keys of nodes still at
// generation 0 are derived from (read at run time, cached 5 minutes, current and previous
// versions); AGENT_TIMEOUT; AGENT_ALLOW_HTTP=true only on the local stack, whose agents are
// plain http on loopback. Every variable: envvar.TerminateNode.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/kmsseal"
	"github.com/openrelay/capacity/shared/secrets"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	s, logger, cfg := config.Start(envvar.TerminateNode, readSettings)
	masters := secrets.New(secretsmanager.NewFromConfig(cfg), s.agentMasterSecretID)
	client := &agent.Client{AllowHTTP: s.allowHTTP, Timeout: s.agentTimeout}
	store := s.Store.Open(cfg)
	nodeAgent := newNodeAgent(client, store, kmsseal.New(kms.NewFromConfig(cfg), s.agentKeysKMSKeyID), masters, logger)
	if s.allowHTTP {
		logger.Warn("AGENT_ALLOW_HTTP is set: plain http agent endpoints are accepted (local stack only)")
	}
	term := &capacity.Terminator{Store: store, Agent: nodeAgent, Logger: logger}
	notifier := &capacity.EvictionNotifier{Store: store, Agent: nodeAgent, Logger: logger, Budget: noticeBudget}
	lambda.Start(dispatch(term, notifier, logger))
}

// newNodeAgent is the function's agent: it signs with each node's own key, opened by sealer
// (KMS) once per key generation, then from the resealed form it stores with store, whose node
// reads it makes return that form (this function alone can open it).
func newNodeAgent(client *agent.Client, store *dynamo.Store, sealer *kmsseal.Sealer, masters agent.MasterSecrets, logger *slog.Logger) agent.NodeAgent {
	store.ReadResealedAgentKeys = true
	return agent.NodeAgent{Client: client, Opener: sealer, Legacy: agent.Derived{Masters: masters},
		Resealer: &agent.Resealer{KMS: sealer, Masters: masters, Store: store, Logger: logger}}
}

// settings are the function's configuration (envvar.TerminateNode).
type settings struct {
	config.Common
	config.Store
	agentMasterSecretID, agentKeysKMSKeyID string
	agentTimeout                           time.Duration
	allowHTTP                              bool
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{
		Common:              config.ReadCommon(e),
		Store:               config.ReadStore(e),
		agentMasterSecretID: envvar.AgentMasterSecretID.Get(e),
		agentKeysKMSKeyID:   envvar.AgentKeysKMSKeyID.Get(e),
		agentTimeout:        envvar.AgentTimeout.Get(e),
		allowHTTP:           envvar.AgentAllowHTTP.Get(e),
	}
	return s
}

// noticeBudget bounds the notice phase under a long grace, well inside the function's 60 s.
const noticeBudget = 40 * time.Second

// dispatch runs the task: the agents' notices (AgentNotices) or a round.
func dispatch(term *capacity.Terminator, notifier *capacity.EvictionNotifier, logger *slog.Logger) func(context.Context, stepfn.Task) (stepfn.Task, error) {
	round := handler(term, logger)
	return func(ctx context.Context, in stepfn.Task) (stepfn.Task, error) {
		if in.AgentNotices {
			return notify(ctx, notifier, logger, in)
		}
		return round(ctx, in)
	}
}

// handler runs one round. A returned error is a platform fault (Step Functions retries the
// task); the agent's failures are in the output, for the state machine to loop on.
func handler(term *capacity.Terminator, logger *slog.Logger) func(context.Context, stepfn.Task) (stepfn.Task, error) {
	return func(ctx context.Context, in stepfn.Task) (stepfn.Task, error) {
		report, err := term.Run(ctx, in.Domain())
		if err != nil {
			return stepfn.Task{}, fmt.Errorf("terminate VMs of %s on node %s: %w", in.ReclaimID, in.NodeID, err)
		}
		out := stepfn.RoundResult(in, report, time.Now())
		logger.InfoContext(ctx, "termination round", "reclaim_id", in.ReclaimID, "node", in.NodeID, "round", in.Round,
			"terminated", out.Terminated, "already_gone", out.AlreadyGone, "failed", len(out.Failed), "done", out.Done)
		return out, nil
	}
}

// notify sends the operation's eviction notices; the output is the input with each VM's
// notice state. A returned error (the store failing) fails the task, which the workflow
// catches: the grace period and the terminations go on without the notices.
func notify(ctx context.Context, notifier *capacity.EvictionNotifier, logger *slog.Logger, in stepfn.Task) (stepfn.Task, error) {
	notices, err := notifier.Run(ctx, in.NoticeTask())
	if err != nil {
		return stepfn.Task{}, fmt.Errorf("eviction notices of %s on node %s: %w", in.ReclaimID, in.NodeID, err)
	}
	out := in
	out.Notices = map[string]string{}
	for vm, n := range notices {
		out.Notices[vm] = string(n.State)
	}
	logger.InfoContext(ctx, "eviction notices", "reclaim_id", in.ReclaimID, "node", in.NodeID, "notices", out.Notices)
	return out, nil
}
