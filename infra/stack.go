package main

import (
	"cmp"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
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
	// TerminateConcurrency is how many nodes the termination workflow works on at once;
	// TerminateRounds how many rounds a node gets; TerminateRetryWait the seconds between
	// rounds. Zero means the default (DefaultTerminate*).
	TerminateConcurrency, TerminateRounds, TerminateRetryWait float64
	// AgentMasterSecretName names an existing Secrets Manager secret to derive the node agents'
	// keys from. Empty: the stack creates capacity/<env>/agent-master (generated).
	AgentMasterSecretName string
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
	// Termination is the STANDARD state machine that terminates a reclaim's VMs, node by node.
	Termination awsstepfunctions.StateMachine
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

	alarmScope    constructs.Construct
	alarmApi      struct{ errorRate, p99Millis float64 }
	assetRoot     string
	logLevel      string
	logRetention  awslogs.RetentionDays
	historyWindow string // HISTORY_RETENTION, a Go duration; "" leaves the store's default
}

// NewCapacityStack builds the stack "capacity-<env>". It is environment-agnostic (no account,
// region or lookups), so synth needs no credentials.
func NewCapacityStack(scope constructs.Construct, props CapacityStackProps) (s *CapacityStack, err error) {
	if err := ValidateEnv(props.Env); err != nil {
		return nil, err
	}
	// The grant is built from the name (a secret's ARN adds a random suffix the name lacks).
	if strings.HasPrefix(props.AgentMasterSecretName, "arn:") {
		return nil, fmt.Errorf("agentMasterSecret %q: give the secret's name, not its ARN", props.AgentMasterSecretName)
	}
	if props.AssetRoot == "" {
		props.AssetRoot = DefaultAssetRoot
	}
	if props.ThrottleRate == 0 {
		props.ThrottleRate = DefaultThrottleRate
	}
	if props.ThrottleBurst == 0 {
		props.ThrottleBurst = DefaultThrottleBurst
	}
	if props.TerminateConcurrency == 0 {
		props.TerminateConcurrency = DefaultTerminateConcurrency
	}
	if props.TerminateRounds == 0 {
		props.TerminateRounds = DefaultTerminateRounds
	}
	if props.TerminateRetryWait == 0 {
		props.TerminateRetryWait = DefaultTerminateRetryWait
		if props.Env == "local" || props.Env == "dev" {
			props.TerminateRetryWait = DefaultTerminateRetryWaitEphemeral
		}
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"TerminateConcurrency", props.TerminateConcurrency}, {"TerminateRounds", props.TerminateRounds}, {"TerminateRetryWait", props.TerminateRetryWait}} {
		if p.v < 1 || p.v != math.Trunc(p.v) || p.v > 3600 {
			return nil, fmt.Errorf("%s %v: want a whole number from 1 to 3600", p.name, p.v)
		}
	}
	// goFunction reports a missing build by panicking with *missingAssetError.
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(*missingAssetError); ok {
				s, err = nil, e
				return
			}
			panic(r)
		}
	}()

	if props.LogLevel == "" {
		props.LogLevel = "info"
	}
	if props.AlarmApiErrorRate == 0 {
		props.AlarmApiErrorRate = DefaultAlarmApiErrorRate
	}
	if props.AlarmApiP99Millis == 0 {
		props.AlarmApiP99Millis = DefaultAlarmApiP99Millis
	}
	ephemeral := props.Env == "local" || props.Env == "dev"
	logRetention := awslogs.RetentionDays_THREE_MONTHS
	if ephemeral {
		logRetention = awslogs.RetentionDays_ONE_WEEK
	}
	if props.LogRetentionDays != 0 {
		r, ok := logRetentions[props.LogRetentionDays]
		if !ok {
			return nil, fmt.Errorf("LogRetentionDays %v: not a CloudWatch Logs retention period", props.LogRetentionDays)
		}
		logRetention = r
	}
	historyWindow := ""
	if h := props.HistoryRetentionDays; h != 0 {
		if h < MinHistoryRetentionDays || h != math.Trunc(h) {
			return nil, fmt.Errorf("HistoryRetentionDays %v: want a whole number of days, at least %d", h, MinHistoryRetentionDays)
		}
		historyWindow = fmt.Sprintf("%dh", int(h)*24)
	}

	env := props.Env
	name := "capacity-" + env
	stackProps := &awscdk.StackProps{
		StackName:   jsii.String(name),
		Description: jsii.String("capacity-boundary service, env " + env),
	}
	if props.Account != "" || props.Region != "" {
		// Pinned: a deploy with another account's or region's credentials fails.
		stackProps.Env = &awscdk.Environment{Account: jsii.String(props.Account), Region: jsii.String(props.Region)}
	}
	s = &CapacityStack{
		Stack:             awscdk.NewStack(scope, jsii.String(name), stackProps),
		Env:               env,
		Ephemeral:         ephemeral,
		Tables:            map[string]awsdynamodb.Table{},
		Alarms:            map[string]awscloudwatch.Alarm{},
		AlarmSubscription: props.AlarmSubscription,
		EventPrincipals:   props.EventPrincipals,
		assetRoot:         props.AssetRoot,
		logLevel:          props.LogLevel,
		logRetention:      logRetention,
		historyWindow:     historyWindow,
	}
	s.alarmApi.errorRate, s.alarmApi.p99Millis = props.AlarmApiErrorRate, props.AlarmApiP99Millis
	awscdk.Tags_Of(s.Stack).Add(jsii.String("project"), jsii.String("capacity"), nil)
	awscdk.Tags_Of(s.Stack).Add(jsii.String("env"), jsii.String(env), nil)

	for _, spec := range stackTables {
		s.Tables[spec.LogicalID] = s.newTable(spec)
	}
	state, audit, keys := s.Tables[table.State.LogicalID], s.Tables[table.Audit.LogicalID], s.Tables[table.Keys.LogicalID]
	limits := s.Tables[table.Limits.LogicalID]
	rate := props.RateLimit
	if rate == (capacity.RateLimit{}) {
		rate = DefaultRateLimit
	}

	// Functions: one goFunction call each, then its grants. The workflow comes between the
	// terminate-node function (its task) and the functions that start it.
	secretID, secretResource := s.agentMasterSecret(props.AgentMasterSecretName)
	s.AgentKeysKey = s.newAgentKeysKey()
	terminateEnv := map[string]*string{
		"STATE_TABLE": state.TableName(), "AGENT_MASTER_SECRET_ID": secretID, "AGENT_TIMEOUT": jsii.String("5s"),
		"AGENT_KEYS_KMS_KEY_ID": s.AgentKeysKey.KeyArn(),
	}
	if env == "local" {
		// The local stack's agents listen on loopback, over plain http. Nowhere else.
		terminateEnv["AGENT_ALLOW_HTTP"] = jsii.String("true")
	}
	s.TerminateNodeFunction = s.goFunction(goFunctionSpec{Name: "terminate-node", MemoryMB: 256,
		Timeout: awscdk.Duration_Seconds(jsii.Number(60)), Environment: terminateEnv})
	// Reads the agent master secret at run time (current and previous versions), for nodes
	// still at key generation 0; nothing else in Secrets Manager. Opens the nodes' sealed keys.
	allowOn(s.TerminateNodeFunction, "AgentMasterSecretRead", secretResource, "secretsmanager:GetSecretValue")
	allowAgentKeys(s.TerminateNodeFunction, "AgentKeysOpen", s.AgentKeysKey, "kms:Decrypt")
	// Reads the operation and the node, moves each terminated VM from the node's decision
	// partition to its history (one transaction: a conditional delete and a put), moves the
	// operation on with conditional updates, and puts each VM's outcome item (a conditional
	// put of its own). No audit access.
	allow(s.TerminateNodeFunction, "StateTable", state, "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:DeleteItem")

	s.Bus = s.newEventBus()
	s.OperationEventsFunction = s.newOperationEventsFunction(state)
	s.Termination = s.newTerminationStateMachine(s.TerminateNodeFunction, s.OperationEventsFunction,
		props.TerminateConcurrency, props.TerminateRounds, props.TerminateRetryWait)
	s.newScheduler()

	s.ApiFunction = s.goFunction(goFunctionSpec{Name: "api", Environment: map[string]*string{
		"STATE_TABLE": state.TableName(), "AUDIT_TABLE": audit.TableName(),
		"KEYS_TABLE": keys.TableName(), "KEY_CACHE_TTL": jsii.String("30s"),
		"STATE_MACHINE_ARN": s.Termination.StateMachineArn(),
		// Scheduled reclaims: one-time schedules in this group put a request on the bus as this role.
		"SCHEDULE_GROUP": s.ScheduleGroup.ScheduleGroupName(), "SCHEDULE_ROLE_ARN": s.SchedulerRole.RoleArn(),
		"EVENT_BUS_ARN":                 s.Bus.EventBusArn(),
		"MAX_PENDING_SCHEDULED_PER_ORG": jsii.String(strconv.Itoa(cmp.Or(props.MaxPendingScheduledPerOrg, capacity.DefaultMaxPendingScheduled))),
		// Each key's rate limit, kept in the limits table.
		"LIMITS_TABLE": limits.TableName(),
		// (shared/config.RateLimit reads them.)
		"RATE_LIMIT_PER_SECOND": jsii.String(strconv.FormatFloat(rate.PerSecond, 'f', -1, 64)),
		"RATE_LIMIT_BURST":      jsii.String(strconv.Itoa(rate.Burst)),
		// Registration, an owner change and a rotation make a node a random agent key,
		// sealed under this key, and hand it out once.
		"AGENT_KEYS_KMS_KEY_ID": s.AgentKeysKey.KeyArn(),
	}})
	if env == "local" {
		// The local stack's agents listen on loopback, over plain http: a node may be
		// registered with an http endpoint there, and nowhere else.
		s.ApiFunction.AddEnvironment(jsii.String("ALLOW_HTTP_AGENTS"), jsii.String("true"), nil)
	}
	// TransactWriteItems is authorised per item action (Put/Update/ConditionCheck). Nodes,
	// reservations and their topology changes are writes of the same kinds; the node item
	// also carries its audit chain's head.
	allow(s.ApiFunction, "StateTable", state,
		"dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem")
	// Appends only (no Update or Delete). GetItem and Query: after a commit whose answer was
	// lost, the service reads the commit's own audit record to learn whether it landed; and
	// the audit of a node (the table) and of a reservation (its index).
	allow(s.ApiFunction, "AuditTableAppendAndRead", audit, "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query")
	allowIndex(s.ApiFunction, "AuditByReservationIndex", audit, table.AuditByReservationIndex, "dynamodb:Query")
	// A reservation's scheduled reclaims are listed from the state table's byState index.
	allowIndex(s.ApiFunction, "StateByStateIndex", state, table.ByStateIndex, "dynamodb:Query")
	// API keys: the lookup of a bearer key (GetItem), and the operator's key management:
	// create (a transaction of Puts, the key chain's head Update and ConditionChecks), list
	// (Scan), revoke and the last-use time (UpdateItem). Only reclaim-events also reads it (below),
	// and no role may delete a key: a revoked key stays, marked, for its audit.
	allow(s.ApiFunction, "KeysTable", keys,
		"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Scan", "dynamodb:ConditionCheckItem")
	// Seals the agent keys it makes, and can open none: no kms:Decrypt here, no read of the
	// master secret, and the key's policy denies this role Decrypt (denyAgentKeysOpen), so
	// whoever takes over the internet-facing function obtains no existing node's key.
	// Rate limits: one conditional UpdateItem (two at most) of the calling key's own item per
	// call, which also tells the stored state when its condition fails; no read, no delete
	// (TTL removes idle items). No other role reaches the table.
	allow(s.ApiFunction, "LimitsTable", limits, "dynamodb:UpdateItem")
	allowAgentKeys(s.ApiFunction, "AgentKeysSeal", s.AgentKeysKey, "kms:Encrypt")
	s.denyAgentKeysOpen(s.ApiFunction)
	allowStateMachine(s.ApiFunction, "StartTermination", s.Termination, "states:StartExecution")
	s.allowScheduling(s.ApiFunction)

	s.ReconcilerFunction = s.goFunction(goFunctionSpec{Name: "reconciler",
		Timeout: awscdk.Duration_Seconds(jsii.Number(60)),
		Environment: map[string]*string{
			"STATE_TABLE": state.TableName(), "STATE_MACHINE_ARN": s.Termination.StateMachineArn(),
			"START_AFTER": jsii.String("30s"), "STUCK_AFTER": jsii.String("15m"), "HELD_AFTER": jsii.String("1h"),
			"EVENT_BUS_NAME": s.Bus.EventBusName(),
		}})
	// Finds operations by state (byState index), reads each one's outcomes (Query on the
	// table), asks what became of its execution, starts or restarts it, and ends, restarts or
	// fails the operation item with conditional updates. Metrics go out as
	// embedded-metric-format log lines, so no cloudwatch:PutMetricData. On the table it
	// reaches operation partitions only (the operation item and its outcomes, which it reads
	// and whose expiry it extends, or removes from a failed one that holds VMs): never a node, reservation, VM or idempotency item, so a
	// compromised reconciler cannot move capacity or its audit head.
	allowIndex(s.ReconcilerFunction, "StateByStateIndex", state, table.ByStateIndex, "dynamodb:Query")
	s.ReconcilerFunction.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("StateTableOperations"),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings("dynamodb:Query", "dynamodb:UpdateItem"),
		Resources: &[]*string{state.TableArn()},
		Conditions: &map[string]any{"ForAllValues:StringLike": map[string]any{
			"dynamodb:LeadingKeys": []string{table.OperationPartitions},
		}},
	}))
	allowStateMachine(s.ReconcilerFunction, "StartTermination", s.Termination, "states:StartExecution")
	allowOn(s.ReconcilerFunction, "DescribeTermination", executionsOf(s.Termination), "states:DescribeExecution")
	// Publishes an operation's report before it ends or fails the operation itself.
	s.allowPutEvents(s.ReconcilerFunction)

	s.newReclaimIntake(state, audit)
	// After every function that publishes: the policy names their roles.
	s.newBusPolicy()
	// A scheduled reclaim's firing reads the key that scheduled it (its id pointer and the
	// key: GetItem only) and is refused if the key was revoked, expired or lost what the
	// reclaim needs. Nothing else on the keys table: no write, no Scan.
	s.ReclaimEventsFunction.AddEnvironment(jsii.String("KEYS_TABLE"), keys.TableName(), nil)
	allow(s.ReclaimEventsFunction, "KeysTableCreatorKeyRead", keys, "dynamodb:GetItem")

	// Every minute. The local stack runner creates schedule rules disabled (kumo never fires
	// them); invoke the reconciler yourself there.
	awsevents.NewRule(s.Stack, jsii.String("ReconcileSchedule"), &awsevents.RuleProps{
		RuleName:    jsii.String(name + "-reconcile"),
		Description: jsii.String("Runs the capacity reconciler every minute (" + env + ")"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(s.ReconcilerFunction, &awseventstargets.LambdaFunctionProps{
			// The next tick is a minute away: a retried or stale tick only doubles the work.
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})},
	})

	s.Api = s.newRestApi(s.ApiFunction, props.ThrottleRate, props.ThrottleBurst)
	if env == "local" {
		s.FloorFunction = s.newFloor(state, audit)
	}

	s.AlarmTopic = s.newAlarmTopic()
	s.alarmScope = constructs.NewConstruct(s.Stack, jsii.String("Alarms"))
	s.newAlarms()
	s.Dashboard = s.newDashboard()

	s.nagSuppressions()

	output := func(id string, value *string, desc string) {
		awscdk.NewCfnOutput(s.Stack, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
	}
	output("ApiUrl", s.Api.Url(), "Base URL of the API stage (ends with /)")
	output("StateTableName", state.TableName(), "State table")
	output("AuditTableName", audit.TableName(), "Audit table")
	output("KeysTableName", keys.TableName(), "API keys table (managed through the api function; the first operator key is written with AWS credentials)")
	output("ApiFunctionName", s.ApiFunction.FunctionName(), "API Lambda function")
	output("StateMachineArn", s.Termination.StateMachineArn(), "Termination workflow (state machine)")
	output("TerminateNodeFunctionName", s.TerminateNodeFunction.FunctionName(), "Termination task Lambda function")
	output("ReconcilerFunctionName", s.ReconcilerFunction.FunctionName(), "Reconciler Lambda function")
	output("AgentMasterSecretId", terminateEnv["AGENT_MASTER_SECRET_ID"], "Secrets Manager secret the node agents' keys are derived from")
	output("AlarmTopicArn", s.AlarmTopic.TopicArn(), "SNS topic every alarm of the environment notifies")
	output("EventBusName", s.Bus.EventBusName(), "Event bus of the service's events and of reclaim requests")
	output("EventBusArn", s.Bus.EventBusArn(), "Event bus ARN")
	output("ReclaimRequestsQueueUrl", s.ReclaimRequests.QueueUrl(), "Queue of accepted reclaim requests (read by reclaim-events)")
	output("ReclaimRequestsDeadLetterQueueUrl", s.ReclaimRequestsDeadLetters.QueueUrl(), "Reclaim requests that failed every try")
	output("ScheduleGroupName", s.ScheduleGroup.ScheduleGroupName(), "EventBridge Scheduler group of the scheduled reclaims")
	output("ReclaimEventsFunctionName", s.ReclaimEventsFunction.FunctionName(), "Reclaim request Lambda function (SQS)")
	output("OperationEventsFunctionName", s.OperationEventsFunction.FunctionName(), "Workflow task Lambda function that publishes notices and reports")
	output("Env", jsii.String(env), "Environment name")
	return s, nil
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
