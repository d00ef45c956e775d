package main

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsscheduler"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctions"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/stepfn"
	"github.com/openrelay/capacity/shared/table"
)

// DefaultAssetRoot is where `make lambdas` puts <fn>/bootstrap, relative to infra/.
const DefaultAssetRoot = "../build/lambda"

// Default stage throttling (requests per second, burst), overridable per stack.
const (
	DefaultThrottleRate  = 100
	DefaultThrottleBurst = 200
)

var envName = regexp.MustCompile(`^[a-z][a-z0-9-]{1,15}$`)

// ValidateEnv rejects environment names that would make invalid or surprising resource names.
func ValidateEnv(env string) error {
	if !envName.MatchString(env) {
		return fmt.Errorf("invalid env %q: must match %s", env, envName)
	}
	return nil
}

// CapacityStackProps configures one environment's stack.
type CapacityStackProps struct {
	// Env names the environment: local, dev, prod, ... (see ValidateEnv).
	Env string
	// AssetRoot holds <fn>/bootstrap for every Go function. Default DefaultAssetRoot.
	AssetRoot string
	// ThrottleRate and ThrottleBurst limit the API stage. Zero means the default.
	ThrottleRate, ThrottleBurst float64
	// TerminateRounds is how many rounds the termination workflow gives a reclaim's VMs;
	// TerminateRetryWait the seconds between rounds. Zero means the default (DefaultTerminate*).
	TerminateRounds, TerminateRetryWait float64
	// AgentMasterSecretName names an existing Secrets Manager secret to derive the node agents'
	// keys from. Empty: the stack creates capacity/<env>/agent-master (generated).
	AgentMasterSecretName string
	// AgentKeysBreakGlassRole is the ARN of the role that may open agent keys and read the
	// master secret besides terminate-node (an operator's, for an emergency); it must exist
	// before the deploy. Empty: none.
	AgentKeysBreakGlassRole string
	// Account and Region, when set, are the stack's env (deployed environments). Empty: the
	// stack is environment-agnostic, as local must be.
	Account, Region string
	// LogLevel of every function (LOG_LEVEL). Empty means info.
	LogLevel string
	// LogRetentionDays of every log group, one of CloudWatch Logs' periods; HistoryRetentionDays
	// of the store's history (HISTORY_RETENTION). Zero means the default (a week in ephemeral
	// environments, three months elsewhere; the store's own default for history).
	LogRetentionDays, HistoryRetentionDays float64
	// AlarmSubscription (an email address or an https endpoint) is who the environment's alarms
	// notify; EventPrincipals the EventBridge sources whose events it accepts, whom each acts
	// as, and which roles may send each (none: no inbound event is accepted). Validated by
	// StackPropsFor; kept on the stack for the alarms and the event intake.
	AlarmSubscription string
	EventPrincipals   []EventPrincipalConfig
	// AlarmApiErrorRate (a fraction of requests) and AlarmApiP99Millis are the API alarms'
	// thresholds. Zero means the default (DefaultAlarm*).
	AlarmApiErrorRate, AlarmApiP99Millis float64
	// MaxPendingScheduledPerOrg caps an org's pending scheduled reclaims
	// (MAX_PENDING_SCHEDULED_PER_ORG of the api function). Zero means the default
	// (capacity.DefaultMaxPendingScheduled).
	MaxPendingScheduledPerOrg int
	// RateLimit is each API key's rate limit (RATE_LIMIT_PER_SECOND and RATE_LIMIT_BURST of
	// the api function). Zero means DefaultRateLimit.
	RateLimit capacity.RateLimit
	// WarmWriteUnits and WarmReadUnits are the state table's and its indexes' warm
	// throughput (zero: DynamoDB's on-demand default); ApiConcurrency the api function's
	// reserved concurrency and TerminateNodeConcurrency terminate-node's (zero: none, the
	// account's shared pool); ReconcilerStartRate the reconciler's START_RATE (zero:
	// capacity.DefaultStartRate).
	WarmWriteUnits, WarmReadUnits            float64
	ApiConcurrency, TerminateNodeConcurrency float64
	ReconcilerStartRate                      float64
}

// CapacityStack is the service's stack for one environment.
type CapacityStack struct {
	awscdk.Stack
	Env string
	// Ephemeral environments (local, dev) are disposable: tables and logs are destroyed with
	// the stack and have no point-in-time recovery.
	Ephemeral bool
	// Tables by shared/table LogicalID.
	Tables      map[string]awsdynamodb.Table
	ApiFunction awslambda.Function
	Api         awsapigateway.RestApi
	// TerminateNodeFunction runs one round of one node's terminations (a workflow task).
	TerminateNodeFunction awslambda.Function
	// ReconcilerFunction starts workflows that a crash left unstarted (every minute).
	ReconcilerFunction awslambda.Function
	// FloorFunction is the benchmark's floor of a reclaim (env local only; nil elsewhere).
	FloorFunction awslambda.Function
	// Bus (capacity-<env>) carries the service's events and the reclaim requests it accepts.
	Bus awsevents.EventBus
	// ReclaimRequests (capacity-<env>-reclaim-requests) queues the accepted reclaim requests
	// for ReclaimEventsFunction; ReclaimRequestsDeadLetters holds those that failed every try.
	ReclaimRequests, ReclaimRequestsDeadLetters awssqs.Queue
	ReclaimEventsFunction                       awslambda.Function
	// OperationEventsFunction publishes a reclaim operation's notices and report (a workflow task).
	OperationEventsFunction awslambda.Function
	// ScheduleGroup (capacity-<env>) holds the scheduled reclaims' schedules; SchedulerRole is
	// what EventBridge Scheduler assumes to fire them.
	ScheduleGroup awsscheduler.ScheduleGroup
	SchedulerRole awsiam.Role
	// Termination is the EXPRESS state machine that runs one step of a reclaim's termination.
	Termination awsstepfunctions.StateMachine
	// TerminationSteps (capacity-<env>-termination-steps) holds the workflow's later steps
	// until due (message delays); TerminationStepsDeadLetters those that failed every try;
	// TerminationStepsFunction starts a run of each.
	TerminationSteps, TerminationStepsDeadLetters awssqs.Queue
	TerminationStepsFunction                      awslambda.Function
	// AgentMasterSecret is the secret the keys of nodes still at key generation 0 are derived
	// from (agent contract v2); only terminate-node reads it.
	AgentMasterSecret awssecretsmanager.ISecret
	// AgentKeysKey is the KMS key node agents' random keys are sealed under (encryption
	// context: purpose and node id): the api function may only Encrypt, terminate-node only
	// Decrypt.
	AgentKeysKey awskms.Key
	// AlarmSubscription and EventPrincipals as configured (see CapacityStackProps).
	AlarmSubscription string
	EventPrincipals   []EventPrincipalConfig
	// publishers are the roles of the functions that publish as the service (allowPutEvents).
	publishers []*string
	// AlarmTopic (capacity-<env>-alarms) receives every alarm's ALARM and OK; Alarms are by
	// what they watch (the part of their name after capacity-<env>-); Dashboard is capacity-<env>.
	AlarmTopic awssns.Topic
	Alarms     map[string]awscloudwatch.Alarm
	Dashboard  awscloudwatch.Dashboard

	// agentMasterSecretID is how terminate-node reads the agent master secret; its ARN
	// (a pattern, for an existing secret) is what terminate-node's grant names.
	agentMasterSecretID, agentMasterSecretARN *string
	agentKeysBreakGlassRole                   string

	alarmScope    constructs.Construct
	alarmApi      struct{ errorRate, p99Millis float64 }
	assetRoot     string
	logLevel      string
	logRetention  awslogs.RetentionDays
	historyWindow string // HISTORY_RETENTION, a Go duration; "" leaves the store's default
	// warm is the state table's warm throughput (writes, reads; zero: the default);
	// concurrency the reserved concurrency by function name; startRate the reconciler's.
	warm        struct{ write, read float64 }
	concurrency map[string]float64
	startRate   float64
}

// NewCapacityStack builds the stack "capacity-<env>". It is environment-agnostic (no account,
// region or lookups), so synth needs no credentials. Each step below adds one part of the
// service; a step may use what the steps before it made.
func NewCapacityStack(scope constructs.Construct, props CapacityStackProps) (s *CapacityStack, err error) {
	if props, err = props.withDefaults(); err != nil {
		return nil, err
	}
	// goFunction reports a missing build by panicking with *missingAssetError.
	defer recoverMissingAsset(&s, &err)

	s = newStack(scope, props)
	s.newTables()
	s.newAgentKeys(props.AgentMasterSecretName, props.AgentKeysBreakGlassRole)
	// Functions: one goFunction call each, then its grants. The workflow comes between the
	// terminate-node function (its task) and the functions that start it.
	s.TerminateNodeFunction = s.newTerminateNodeFunction()
	s.Bus = s.newEventBus()
	s.OperationEventsFunction = s.newOperationEventsFunction(s.table(table.State))
	s.newTerminationStepsQueue()
	s.Termination = s.newTerminationStateMachine(s.TerminateNodeFunction, s.OperationEventsFunction,
		props.TerminateRounds, props.TerminateRetryWait)
	s.TerminationStepsFunction = s.newTerminationStepsFunction()
	s.newScheduler()
	s.ApiFunction = s.newApiFunction(props.MaxPendingScheduledPerOrg, props.RateLimit)
	s.ReconcilerFunction = s.newReconcilerFunction()
	s.newReclaimIntake(s.table(table.State), s.table(table.Audit), s.table(table.Keys))
	// After every function that publishes: the policy names their roles.
	s.newBusPolicy()
	s.newReconcileSchedule()
	s.Api = s.newRestApi(s.ApiFunction, props.ThrottleRate, props.ThrottleBurst)
	if s.Env == LocalEnv {
		s.FloorFunction = s.newFloor(s.table(table.State), s.table(table.Audit))
	}
	s.newMonitoring()
	s.nagSuppressions()
	s.newOutputs()
	return s, nil
}

// recoverMissingAsset turns goFunction's *missingAssetError panic into NewCapacityStack's
// error; any other panic goes on.
func recoverMissingAsset(s **CapacityStack, err *error) {
	if r := recover(); r != nil {
		if e, ok := r.(*missingAssetError); ok {
			*s, *err = nil, e
			return
		}
		panic(r)
	}
}

// isEphemeral tells the disposable environments (local, dev): see CapacityStack.Ephemeral.
func isEphemeral(env string) bool { return env == LocalEnv || env == "dev" }

// withDefaults validates props and fills every zero value with its default.
func (props CapacityStackProps) withDefaults() (CapacityStackProps, error) {
	if err := ValidateEnv(props.Env); err != nil {
		return props, err
	}
	// The grant is built from the name (a secret's ARN adds a random suffix the name lacks).
	if strings.HasPrefix(props.AgentMasterSecretName, "arn:") {
		return props, fmt.Errorf("agentMasterSecret %q: give the secret's name, not its ARN", props.AgentMasterSecretName)
	}
	ephemeral := isEphemeral(props.Env)
	props.AssetRoot = cmp.Or(props.AssetRoot, DefaultAssetRoot)
	props.ThrottleRate = cmp.Or(props.ThrottleRate, DefaultThrottleRate)
	props.ThrottleBurst = cmp.Or(props.ThrottleBurst, DefaultThrottleBurst)
	props.TerminateRounds = cmp.Or(props.TerminateRounds, DefaultTerminateRounds)
	if props.TerminateRetryWait == 0 {
		props.TerminateRetryWait = DefaultTerminateRetryWait
		if ephemeral {
			props.TerminateRetryWait = DefaultTerminateRetryWaitEphemeral
		}
	}
	// The retry wait is a message delay: at most SQS's 900 s.
	for _, p := range []struct {
		name   string
		v, max float64
	}{{"TerminateRounds", props.TerminateRounds, 3600}, {"TerminateRetryWait", props.TerminateRetryWait, stepfn.MaxDelaySeconds}} {
		if p.v < 1 || p.v != math.Trunc(p.v) || p.v > p.max {
			return props, fmt.Errorf("%s %v: want a whole number from 1 to %v", p.name, p.v, p.max)
		}
	}
	props.LogLevel = cmp.Or(props.LogLevel, "info")
	props.AlarmApiErrorRate = cmp.Or(props.AlarmApiErrorRate, DefaultAlarmApiErrorRate)
	props.AlarmApiP99Millis = cmp.Or(props.AlarmApiP99Millis, DefaultAlarmApiP99Millis)
	if props.LogRetentionDays == 0 {
		props.LogRetentionDays = 90
		if ephemeral {
			props.LogRetentionDays = 7
		}
	}
	if _, ok := logRetentions[props.LogRetentionDays]; !ok {
		return props, fmt.Errorf("LogRetentionDays %v: not a CloudWatch Logs retention period", props.LogRetentionDays)
	}
	if h := props.HistoryRetentionDays; h != 0 && (h < MinHistoryRetentionDays || h != math.Trunc(h)) {
		return props, fmt.Errorf("HistoryRetentionDays %v: want a whole number of days, at least %d", h, MinHistoryRetentionDays)
	}
	props.MaxPendingScheduledPerOrg = cmp.Or(props.MaxPendingScheduledPerOrg, capacity.DefaultMaxPendingScheduled)
	if props.RateLimit == (capacity.RateLimit{}) {
		props.RateLimit = DefaultRateLimit
	}
	return props, nil
}

// newStack creates the empty stack "capacity-<env>" from props with their defaults, tagged
// with the project and the environment.
func newStack(scope constructs.Construct, props CapacityStackProps) *CapacityStack {
	name := stackname.Stack(props.Env)
	stackProps := &awscdk.StackProps{
		StackName:   jsii.String(name),
		Description: jsii.String("capacity-boundary service, env " + props.Env),
	}
	if props.Account != "" || props.Region != "" {
		// Pinned: a deploy with another account's or region's credentials fails.
		stackProps.Env = &awscdk.Environment{Account: jsii.String(props.Account), Region: jsii.String(props.Region)}
	}
	s := &CapacityStack{
		Stack:             awscdk.NewStack(scope, jsii.String(name), stackProps),
		Env:               props.Env,
		Ephemeral:         isEphemeral(props.Env),
		Tables:            map[string]awsdynamodb.Table{},
		Alarms:            map[string]awscloudwatch.Alarm{},
		AlarmSubscription: props.AlarmSubscription,
		EventPrincipals:   props.EventPrincipals,
		assetRoot:         props.AssetRoot,
		logLevel:          props.LogLevel,
		logRetention:      logRetentions[props.LogRetentionDays],
	}
	if h := props.HistoryRetentionDays; h != 0 {
		s.historyWindow = fmt.Sprintf("%dh", int(h)*24)
	}
	s.alarmApi.errorRate, s.alarmApi.p99Millis = props.AlarmApiErrorRate, props.AlarmApiP99Millis
	s.warm.write, s.warm.read, s.startRate = props.WarmWriteUnits, props.WarmReadUnits, props.ReconcilerStartRate
	s.concurrency = map[string]float64{}
	if n := props.ApiConcurrency; n > 0 {
		s.concurrency[envvar.API.Name()] = n
	}
	if n := props.TerminateNodeConcurrency; n > 0 {
		s.concurrency[envvar.TerminateNode.Name()] = n
	}
	awscdk.Tags_Of(s.Stack).Add(jsii.String("project"), jsii.String(stackname.Project), nil)
	awscdk.Tags_Of(s.Stack).Add(jsii.String("env"), jsii.String(props.Env), nil)
	return s
}

// logGroup creates the log group "LogGroup" under scope: kept for the environment's log
// retention, and removed or retained with the stack's data.
func (s *CapacityStack) logGroup(scope constructs.Construct, name string) awslogs.LogGroup {
	return awslogs.NewLogGroup(scope, jsii.String("LogGroup"), &awslogs.LogGroupProps{
		LogGroupName:  jsii.String(name),
		Retention:     s.logRetention,
		RemovalPolicy: s.removalPolicy(),
	})
}

// removalPolicy: ephemeral environments are destroyed with their stack, others keep data.
func (s *CapacityStack) removalPolicy() awscdk.RemovalPolicy {
	if s.Ephemeral {
		return awscdk.RemovalPolicy_DESTROY
	}
	return awscdk.RemovalPolicy_RETAIN
}
