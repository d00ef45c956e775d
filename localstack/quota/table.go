package quota

import (
	"fmt"
	"slices"
)

// ID names one quota the local stack models.
type ID string

const (
	SFNStandardStart      ID = "sfn.standard.StartExecution"
	SFNStateTransitions   ID = "sfn.standard.StateTransition"
	SFNExpressStart       ID = "sfn.express.StartExecution"
	LambdaConcurrency     ID = "lambda.ConcurrentExecutions"
	DynamoPartitionWrite  ID = "dynamodb.partition.WCU"
	DynamoPartitionRead   ID = "dynamodb.partition.RCU"
	DynamoWarmWrite       ID = "dynamodb.onDemandWarm.WRU"
	DynamoWarmRead        ID = "dynamodb.onDemandWarm.RRU"
	APIGatewayAccount     ID = "apigateway.account"
	EventsPutEvents       ID = "events.PutEvents"
	EventsRuleInvocations ID = "events.Invocations"
	SchedulerInvocations  ID = "scheduler.Invocations"
)

// Row is one of AWS's default quotas in one region: a token bucket of Bucket tokens refilled
// at Refill a second (a concurrency quota has Bucket only). Source is the AWS page that states it.
type Row struct {
	ID     ID
	Region string
	Name   string  // as AWS's quota page names it
	Bucket float64 // bucket size (burst), or the concurrency limit
	Refill float64 // tokens a second; 0 for a concurrency limit
	Unit   string
	Answer string // what the caller meets when it is exceeded
	Source string
}

// The AWS pages the rows come from.
const (
	srcSFN         = "https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html"
	srcLambda      = "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html"
	srcPartition   = "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html"
	srcWarm        = "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html"
	srcAPIGateway  = "https://docs.aws.amazon.com/apigateway/latest/developerguide/limits.html"
	srcEventBridge = "https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-quota.html"
	srcScheduler   = "https://docs.aws.amazon.com/scheduler/latest/UserGuide/scheduler-quotas.html"
)

// Regions are the regions Defaults has rows for: the environments' regions in cdk.json, and the
// local stack's own.
var Regions = []string{"eu-west-1", "us-east-1"}

// Defaults is AWS's documented default quotas the local stack models, per region. The API
// Gateway stage throttle and Lambda reserved concurrency are not here: they are what the
// template sets (Resources).
var Defaults = func() []Row {
	var rows []Row
	for _, region := range Regions {
		// eu-west-1 and us-east-1 are both among the regions with the larger defaults
		// wherever a quota differs by region (Step Functions' "us-east-1, us-west-2,
		// eu-west-1" rows, EventBridge's and Scheduler's primary regions).
		rows = append(rows,
			Row{SFNStandardStart, region, "StartExecution (Standard)", 1300, 300, "executions", "ThrottlingException (400)", srcSFN},
			Row{SFNStateTransitions, region, "StateTransition (Standard)", 5000, 1500, "state transitions", "transitions delayed", srcSFN},
			Row{SFNExpressStart, region, "StartExecution (Express)", 6000, 6000, "executions", "ThrottlingException (400)", srcSFN},
			Row{LambdaConcurrency, region, "Concurrent executions", 1000, 0, "concurrent executions", "TooManyRequestsException (429)", srcLambda},
			Row{DynamoPartitionWrite, region, "Write throughput per partition", 1000, 1000, "WCU", "ThrottlingException (400); ThrottlingError reason in a transaction", srcPartition},
			Row{DynamoPartitionRead, region, "Read throughput per partition", 3000, 3000, "RCU", "ThrottlingException (400); ThrottlingError reason in a transaction", srcPartition},
			Row{DynamoWarmWrite, region, "Warm throughput of a new on-demand table, writes", 4000, 4000, "WRU", "ThrottlingException (400)", srcWarm},
			Row{DynamoWarmRead, region, "Warm throughput of a new on-demand table, reads", 12000, 12000, "RRU", "ThrottlingException (400)", srcWarm},
			Row{APIGatewayAccount, region, "Throttle quota per account, per Region", 5000, 10000, "requests", "429 Too Many Requests", srcAPIGateway},
			Row{EventsPutEvents, region, "PutEvents throttle limit in transactions per second", 10000, 10000, "requests", "ThrottlingException (400)", srcEventBridge},
			Row{EventsRuleInvocations, region, "Invocations throttle limit in transactions per second", 18750, 18750, "invocations", "invocations delayed", srcEventBridge},
			Row{SchedulerInvocations, region, "Invocations throttle limit", 1000, 1000, "invocations", "invocations delayed", srcScheduler},
		)
	}
	return rows
}()

// Rows returns the region's rows by ID.
func Rows(region string) (map[ID]Row, error) {
	if !slices.Contains(Regions, region) {
		return nil, fmt.Errorf("quota: no default quotas for region %q (known: %v)", region, Regions)
	}
	out := map[ID]Row{}
	for _, r := range Defaults {
		if r.Region == region {
			out[r.ID] = r
		}
	}
	return out, nil
}
