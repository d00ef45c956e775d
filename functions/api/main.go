// Command api is the Lambda behind the REST API: it wires configuration, the DynamoDB store,
// the domain service and the HTTP handler, then serves API Gateway proxy events.
//
// Environment beyond the store's and the workflow's: AGENT_KEYS_KMS_KEY_ID, the KMS key node
// agents' keys are sealed under, so that registering a node, changing its owner or rotating
// its key makes a random key, stores it sealed and hands it out once (unset: none is handed
// out). The function may only encrypt under that key: it can open no stored key, and it has
// no access to the agent master secret. ALLOW_HTTP_AGENTS=true only in env local, whose
// agents are plain http on loopback.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/kmsseal"
	"github.com/openrelay/capacity/shared/scheduler"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("APP_ENV", "STATE_TABLE", "AUDIT_TABLE", "KEYS_TABLE", "LIMITS_TABLE", "STATE_MACHINE_ARN"))
	keyTTL := config.Must(config.Duration("KEY_CACHE_TTL", 30*time.Second))
	cfg := config.Must(config.AWS(context.Background()))

	store := dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], env["AUDIT_TABLE"])
	// How long history is kept (the stack sets it per environment; 0: the store's default).
	store.Retention = config.Must(config.Duration("HISTORY_RETENTION", 0))
	store.KeysTable = env["KEYS_TABLE"]
	store.LimitsTable = env["LIMITS_TABLE"]
	rate := config.Must(config.RateLimit())
	workflow := &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: env["STATE_MACHINE_ARN"]}
	metrics := emf.New(os.Stdout, env["APP_ENV"])
	sched := scheduling{Scheduler: config.Must(schedulerFromEnv(cfg)),
		MaxPendingPerOrg: config.Must(config.PositiveInt("MAX_PENDING_SCHEDULED_PER_ORG", capacity.DefaultMaxPendingScheduled))}
	agents := agentConfig{AllowHTTP: config.Must(allowHTTPAgents(os.Getenv("ALLOW_HTTP_AGENTS"), env["APP_ENV"]))}
	if id := os.Getenv("AGENT_KEYS_KMS_KEY_ID"); id != "" {
		agents.Sealer = kmsseal.New(kms.NewFromConfig(cfg), id)
	} else {
		logger.Warn("AGENT_KEYS_KMS_KEY_ID is not set: registering a node hands out no agent key, and none can be rotated")
	}
	lambda.Start(newAdapter(store, workflow, sched, metrics, keyTTL, agents, &rate, logger).ProxyWithContext)
}

// agentConfig is what the API needs of the node agents: the sealer of the keys it makes
// (nil: none is handed out) and whether plain http agent endpoints are accepted.
type agentConfig struct {
	Sealer    capacity.AgentKeySealer
	AllowHTTP bool
}

// allowHTTPAgents parses ALLOW_HTTP_AGENTS: "true", or "" / "false". Anything else is refused,
// so a typo cannot quietly change what nodes may register, and so is "true" outside APP_ENV
// local: the function then fails its init rather than accept agents in clear.
func allowHTTPAgents(v, appEnv string) (bool, error) {
	switch v {
	case "", "false":
		return false, nil
	case "true":
		if appEnv != "local" {
			return false, fmt.Errorf("environment variable ALLOW_HTTP_AGENTS is true in env %q: plain http agents are allowed only in env local", appEnv)
		}
		return true, nil
	}
	return false, fmt.Errorf("environment variable ALLOW_HTTP_AGENTS: %q, want true or false", v)
}

// schedulerFromEnv returns the EventBridge Scheduler adapter when SCHEDULE_GROUP,
// SCHEDULE_ROLE_ARN and EVENT_BUS_ARN are all set, nil when none is (scheduled reclaims then
// answer 501 scheduling_unavailable), and an error when only some are.
func schedulerFromEnv(cfg aws.Config) (capacity.Scheduler, error) {
	group, role, bus := os.Getenv("SCHEDULE_GROUP"), os.Getenv("SCHEDULE_ROLE_ARN"), os.Getenv("EVENT_BUS_ARN")
	switch {
	case group == "" && role == "" && bus == "":
		return nil, nil
	case group == "" || role == "" || bus == "":
		return nil, fmt.Errorf("SCHEDULE_GROUP, SCHEDULE_ROLE_ARN and EVENT_BUS_ARN go together: set all three or none")
	}
	return &scheduler.Schedules{Client: awsscheduler.NewFromConfig(cfg), Group: group, RoleARN: role, BusARN: bus}, nil
}

// scheduling is what scheduled reclaims need: the scheduler (nil: they are unavailable) and
// the cap on an org's pending ones (0: the default).
type scheduling struct {
	Scheduler        capacity.Scheduler
	MaxPendingPerOrg int
}

// newAdapter wires the store, workflow, domain and HTTP API into an API Gateway proxy handler.
// rate is the environment's per-key rate limit (nil: calls are not limited).
func newAdapter(store *dynamo.Store, workflow capacity.Workflow, sched scheduling, metrics capacity.Metrics, keyTTL time.Duration, agents agentConfig, rate *capacity.RateLimit, logger *slog.Logger) *httpadapter.HandlerAdapter {
	svc := &capacity.Service{Store: store, Workflow: workflow, Logger: logger, Metrics: metrics,
		Keys: store, AgentKeySealer: agents.Sealer, AllowHTTPAgents: agents.AllowHTTP, RateLimit: rate}
	if sched.Scheduler != nil {
		svc.Scheduler, svc.Schedules, svc.MaxPendingScheduled = sched.Scheduler, store, sched.MaxPendingPerOrg
	}
	handler := &httpapi.Handler{
		Service:   svc,
		Auth:      &auth.Authenticator{Keys: store.Keys(), TTL: keyTTL, Touch: store.Keys(), Logger: logger},
		Logger:    logger,
		RequestID: apiGatewayRequestID,
		BasePath:  apiGatewayBasePath,
	}
	if rate != nil {
		// Right after authentication, before any node read or write (see httpapi.Handler).
		limiter := &capacity.RateLimiter{Store: store, Limit: *rate, Logger: logger}
		limiter.Metrics, _ = metrics.(capacity.RateMetrics)
		handler.Limit = limiter
	}
	return httpadapter.New(handler.Mux())
}

// apiGatewayRequestID returns API Gateway's id for the request, so logs, the audit trail and
// API Gateway's own logs share one id.
func apiGatewayRequestID(r *http.Request) string {
	if rc, ok := core.GetAPIGatewayContextFromContext(r.Context()); ok {
		return rc.RequestID
	}
	return ""
}

// apiGatewayBasePath returns the path API Gateway serves the API under: what its request
// context's path holds before the route's path ("/prod" on the execute-api domain, a base path
// mapping's "/capacity" on a custom domain), else "/<stage>"; "" outside API Gateway.
func apiGatewayBasePath(r *http.Request) string {
	rc, ok := core.GetAPIGatewayContextFromContext(r.Context())
	if !ok {
		return ""
	}
	if base, ok := strings.CutSuffix(rc.Path, r.URL.Path); ok && r.URL.Path != "" {
		return base
	}
	if rc.Stage != "" && rc.Stage != "$default" {
		return "/" + rc.Stage
	}
	return ""
}
