// Command api is the Lambda behind the REST API: it wires configuration, the DynamoDB store,
// the domain service and the HTTP handler, then serves API Gateway proxy events.
//
// Environment beyond the store's and the workflow's: AGENT_KEYS_KMS_KEY_ID, the KMS key node
// agents' keys are sealed under, so that registering a node, changing its owner or rotating
// its key makes a random key, stores it sealed and hands it out once (unset: none is handed
// out). The function may only encrypt under that key: it can open no stored key, and it has
// no access to the agent master secret. AGENT_ALLOW_HTTP=true only in env local, whose
// agents are plain http on loopback. Every variable: envvar.API.
package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	awsscheduler "github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"

	"github.com/openrelay/capacity/console"
	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/kmsseal"
	"github.com/openrelay/capacity/shared/scheduler"
)

func main() {
	s, logger, cfg := config.Start(envvar.API, readSettings)

	store := s.Store.Open(cfg)
	workflow := config.Workflow(cfg, s.stateMachineARN)
	metrics := s.Metrics()
	sched := scheduling{MaxPendingPerOrg: s.maxPendingPerOrg}
	if s.schedules != (schedules{}) {
		sched.Scheduler = &scheduler.Schedules{Client: awsscheduler.NewFromConfig(cfg), Group: s.schedules.group,
			RoleARN: s.schedules.roleARN, BusARN: s.schedules.busARN}
	}
	agents := agentConfig{AllowHTTP: s.allowHTTPAgents}
	if s.agentKeysKMSKeyID != "" {
		agents.Sealer = kmsseal.New(kms.NewFromConfig(cfg), s.agentKeysKMSKeyID)
	} else {
		logger.Warn("AGENT_KEYS_KMS_KEY_ID is not set: registering a node hands out no agent key, and none can be rotated")
	}
	lambda.Start(newAdapter(store, workflow, sched, metrics, s.keyTTL, agents, &s.rate, logger).ProxyWithContext)
}

// settings are the function's configuration (envvar.API).
type settings struct {
	config.Common
	config.Store
	stateMachineARN  string
	keyTTL           time.Duration
	rate             capacity.RateLimit
	schedules        schedules
	maxPendingPerOrg int // 0: the default
	// The KMS key the agent keys the function makes are sealed under ("": none is handed out).
	agentKeysKMSKeyID string
	allowHTTPAgents   bool
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{
		Common:            config.ReadCommon(e),
		Store:             config.ReadStore(e),
		stateMachineARN:   envvar.StateMachineARN.Get(e),
		keyTTL:            envvar.KeyCacheTTL.Get(e),
		rate:              config.RateLimit(e),
		schedules:         readSchedules(e),
		maxPendingPerOrg:  envvar.MaxPendingScheduledPerOrg.Get(e),
		agentKeysKMSKeyID: envvar.AgentKeysKMSKeyID.Optional(e),
		allowHTTPAgents:   envvar.AgentAllowHTTP.Get(e),
	}
	return s
}

// agentConfig is what the API needs of the node agents: the sealer of the keys it makes
// (nil: none is handed out) and whether plain http agent endpoints are accepted.
type agentConfig struct {
	Sealer    capacity.AgentKeySealer
	AllowHTTP bool
}

// schedules is where scheduled reclaims go: the zero value when scheduling is unavailable.
type schedules struct{ group, roleARN, busARN string }

// readSchedules reads SCHEDULE_GROUP, SCHEDULE_ROLE_ARN and EVENT_BUS_ARN: all set, or none
// (scheduled reclaims then answer 501 scheduling_unavailable); only some is an error.
func readSchedules(e *envvar.Env) schedules {
	s := schedules{envvar.ScheduleGroup.Optional(e), envvar.ScheduleRoleARN.Optional(e), envvar.EventBusARN.Optional(e)}
	if s != (schedules{}) && (s.group == "" || s.roleARN == "" || s.busARN == "") {
		e.Fail(fmt.Errorf("%s, %s and %s go together: set all three or none",
			envvar.ScheduleGroup.Name(), envvar.ScheduleRoleARN.Name(), envvar.EventBusARN.Name()))
		return schedules{}
	}
	return s
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
	// The web console's page and files beside the API, from the same origin.
	return httpadapter.New(console.With(handler.Mux()))
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
