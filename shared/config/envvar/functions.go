package envvar

import (
	"slices"
	"time"
)

// Every function's.
var (
	// AppEnv names the environment (local, dev, prod, ...): the metrics' Environment.
	AppEnv = Text{spec{"APP_ENV", Stack}}
	// LogLevel of the function's JSON logs (cdk.json logLevel).
	LogLevel = Level{spec{"LOG_LEVEL", Stack}}
	// Faults installs the AWS fault injector (shared/awsfault) with these rules on every
	// client; only against a loopback endpoint (shared/config.Faults).
	Faults = Text{spec{"CAPACITY_FAULTS", Developer}}
	// FaultsSeed seeds the fault injector (unset: the clock).
	FaultsSeed = Seed{spec{"CAPACITY_FAULTS_SEED", Developer}}
	// CallLog is a directory where every client logs the AWS calls it makes (shared/calllog),
	// for the local stack's IAM check; only against a loopback endpoint (shared/config.CallLog).
	CallLog = Text{spec{"CAPACITY_CALL_LOG", Developer}}
)

// Tables, workflow, bus and keys.
var (
	StateTable      = Text{spec{"STATE_TABLE", Stack}}
	AuditTable      = Text{spec{"AUDIT_TABLE", Stack}}
	KeysTable       = Text{spec{"KEYS_TABLE", Stack}}
	LimitsTable     = Text{spec{"LIMITS_TABLE", Stack}}
	StateMachineARN = Text{spec{"STATE_MACHINE_ARN", Stack}}
	EventBusName    = Text{spec{"EVENT_BUS_NAME", Stack}}
	// HistoryRetention is how long the store keeps history (cdk.json retention.historyDays;
	// unset: the store's default).
	HistoryRetention = Duration{spec{"HISTORY_RETENTION", StackSometimes}, 0}
	// AgentKeysKMSKeyID is the KMS key node agents' keys are sealed under.
	AgentKeysKMSKeyID = Text{spec{"AGENT_KEYS_KMS_KEY_ID", Stack}}
	// AgentAllowHTTP=true accepts plain http agent endpoints: env local only, whose agents
	// are on loopback (the api function registers them, terminate-node calls them).
	AgentAllowHTTP = LocalFlag{spec{"AGENT_ALLOW_HTTP", StackSometimes}}
)

// The api function's.
var (
	// KeyCacheTTL is how long a function instance caches an API key lookup.
	KeyCacheTTL = Duration{spec{"KEY_CACHE_TTL", Stack}, 30 * time.Second}
	// RateLimitPerSecond and RateLimitBurst are the per-key rate limit (cdk.json rateLimit).
	RateLimitPerSecond = Number{spec{"RATE_LIMIT_PER_SECOND", Stack}}
	RateLimitBurst     = Whole{spec{"RATE_LIMIT_BURST", Stack}}
	// ScheduleGroup, ScheduleRoleARN and EventBusARN go together: the scheduled reclaims'
	// schedule group, the role EventBridge Scheduler assumes and the bus it puts them on.
	ScheduleGroup   = Text{spec{"SCHEDULE_GROUP", Stack}}
	ScheduleRoleARN = Text{spec{"SCHEDULE_ROLE_ARN", Stack}}
	EventBusARN     = Text{spec{"EVENT_BUS_ARN", Stack}}
	// MaxPendingScheduledPerOrg caps an org's pending scheduled reclaims (unset: the domain's
	// default, capacity.DefaultMaxPendingScheduled).
	MaxPendingScheduledPerOrg = Count{spec{"MAX_PENDING_SCHEDULED_PER_ORG", Stack}}
)

// The reclaim intake's (reclaim-events).
var (
	// EventPrincipals is whom each event source acts as (capacity.ParseEventPrincipals).
	EventPrincipals = Text{spec{"EVENT_PRINCIPALS", Stack}}
	// IntakeQueueARN and EventAccount are where a genuine request comes from.
	IntakeQueueARN = Text{spec{"INTAKE_QUEUE_ARN", Stack}}
	// IntakeQueueURL is the same queue, which proves each record's receipt handle.
	IntakeQueueURL = Text{spec{"INTAKE_QUEUE_URL", Stack}}
	EventAccount   = Text{spec{"EVENT_ACCOUNT", Stack}}
)

// The reconciler's.
var (
	// StartAfter: a pending operation's workflow is started after this long unstarted.
	StartAfter = Duration{spec{"START_AFTER", Stack}, 30 * time.Second}
	// StuckAfter: an operation running this long is reported stuck.
	StuckAfter = Duration{spec{"STUCK_AFTER", Stack}, 15 * time.Minute}
	// HeldAfter: a failed operation holding VMs this long is reported (unset: the domain's
	// default, capacity.DefaultHeldAfter).
	HeldAfter = Duration{spec{"HELD_AFTER", Stack}, 0}
	// StartRate: the starts a second the reconciler's drain of pending-start operations
	// makes (unset: capacity.DefaultStartRate).
	StartRate = Count{spec{"START_RATE", Stack}}
)

// terminate-node's.
var (
	// AgentMasterSecretID is the Secrets Manager secret the keys of nodes still at
	// generation 0 are derived from.
	AgentMasterSecretID = Text{spec{"AGENT_MASTER_SECRET_ID", Stack}}
	// AgentTimeout bounds one call to a node's agent.
	AgentTimeout = Duration{spec{"AGENT_TIMEOUT", Stack}, 5 * time.Second}
)

// termination-steps'.
var (
	// TerminationStepsQueueURL is the queue of the workflow's later steps, which
	// termination-steps sends an early step back to.
	TerminationStepsQueueURL = Text{spec{"TERMINATION_STEPS_QUEUE_URL", Stack}}
)

// Lambda's (and the local stack runner's, as Lambda's).
var (
	// Region is the function's AWS region.
	Region = Runtime{"AWS_REGION"}
	// EndpointURL redirects every AWS client (the local stack sets it; AWS does not).
	EndpointURL = Runtime{"AWS_ENDPOINT_URL"}
	// FunctionName is the Lambda function's name.
	FunctionName = Runtime{"AWS_LAMBDA_FUNCTION_NAME"}
)

// Function is a function's name (its package under functions/) and the variables it reads.
type Function struct {
	name string
	vars []Variable
}

// function declares a function: every function reads the common variables too.
func function(name string, vars ...Variable) Function {
	return Function{name: name, vars: append([]Variable{AppEnv, LogLevel, Faults, FaultsSeed, CallLog}, vars...)}
}

// Declare declares a function of the variables given, and of no others: for the tests of a
// reader. The functions' own declarations are the ones below, which the stack's tests check.
func Declare(name string, vars ...Variable) Function {
	return Function{name: name, vars: vars}
}

// Which function reads which.
var (
	API = function("api", StateTable, AuditTable, KeysTable, LimitsTable, StateMachineARN, KeyCacheTTL,
		HistoryRetention, RateLimitPerSecond, RateLimitBurst, ScheduleGroup, ScheduleRoleARN, EventBusARN,
		MaxPendingScheduledPerOrg, AgentKeysKMSKeyID, AgentAllowHTTP)
	Floor           = function("floor", StateMachineARN)
	OperationEvents = function("operation-events", StateTable, EventBusName)
	ReclaimEvents   = function("reclaim-events", StateTable, AuditTable, KeysTable, StateMachineARN, EventBusName,
		EventPrincipals, IntakeQueueARN, IntakeQueueURL, EventAccount, HistoryRetention)
	Reconciler = function("reconciler", StateTable, StateMachineARN, HistoryRetention, EventBusName,
		StartAfter, StuckAfter, HeldAfter, StartRate)
	TerminateNode = function("terminate-node", StateTable, AgentMasterSecretID, AgentKeysKMSKeyID, AgentTimeout,
		AgentAllowHTTP, HistoryRetention)
	TerminationSteps = function("termination-steps", StateMachineARN, TerminationStepsQueueURL)
)

// Functions are every function's declaration.
var Functions = []Function{API, Floor, OperationEvents, ReclaimEvents, Reconciler, TerminateNode, TerminationSteps}

// Named returns the declaration of the function name, and whether there is one.
func Named(name string) (Function, bool) {
	i := slices.IndexFunc(Functions, func(f Function) bool { return f.name == name })
	if i < 0 {
		return Function{}, false
	}
	return Functions[i], true
}

// Name is the function's package directory under functions/, e.g. "terminate-node".
func (f Function) Name() string { return f.name }

// Variables are the variables the function reads.
func (f Function) Variables() []Variable { return slices.Clone(f.vars) }

// Names are the names of the variables the function reads, sorted.
func (f Function) Names() []string {
	names := make([]string, len(f.vars))
	for i, v := range f.vars {
		names[i] = v.Name()
	}
	slices.Sort(names)
	return names
}

// Declares reports whether the function reads the variable name.
func (f Function) Declares(name string) bool {
	return slices.ContainsFunc(f.vars, func(v Variable) bool { return v.Name() == name })
}
