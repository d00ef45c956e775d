// Package cost prices a typical reclaim on AWS from what the stack is (the synthesised
// template: state machines and their definitions, functions' memory and architecture, log
// levels, tracing, tables and their indexes, queues) and what a reclaim does (the DynamoDB
// calls the ReclaimUnits benchmark measured, docs/cost/units.json), at one region's list
// prices. It prices whatever the template holds (a Standard or an Express state machine, a
// queue between steps), not one design, so that docs/cost.md follows the stack.
//
// It imports nothing from the CDK: infra/cost_test.go synthesises the stack and hands the
// template over.
package cost

// UnitPrice is a unit price with the page it comes from.
type UnitPrice struct {
	USD    float64 // per Unit
	Unit   string
	Source string
}

// Prices are one region's list prices, no free tier, first tier where tiered.
type Prices struct {
	Region string

	APIGatewayREST UnitPrice // per request
	LambdaRequest  UnitPrice
	LambdaGBsArm   UnitPrice // per GB-second, arm64
	LambdaGBsX86   UnitPrice

	SFNTransition UnitPrice // Standard, per state transition
	SFNExpressReq UnitPrice // Express, per execution
	SFNExpressGBs UnitPrice // Express, per GB-second (64 MB steps, 100 ms steps)
	DynamoWRU     UnitPrice // on-demand
	DynamoRRU     UnitPrice
	DynamoStorage UnitPrice // per GB-month
	// The Standard-Infrequent Access table class: the same units at its own prices.
	DynamoWRUIA, DynamoRRUIA, DynamoStorageIA UnitPrice
	DynamoPITR                                UnitPrice // continuous backups, per GB-month of table size
	EventBridgeEvent                          UnitPrice // custom event, per 64 KB chunk
	SQSRequest                                UnitPrice // standard queue, per 64 KB chunk
	KMSRequest                                UnitPrice
	SchedulerInvoke                           UnitPrice
	LogsIngest                                UnitPrice // per GB, CloudWatch Logs standard class
	LogsVendedIngest                          UnitPrice // per GB, vended logs (Lambda, Step Functions), first 10 TB
	LogsStorage                               UnitPrice // per GB-month
	XRayTrace                                 UnitPrice // per trace recorded
}

// EUWest1 is Europe (Ireland), the prices on the pages named, read when this was written:
// check them there before quoting a figure, and change them here (docs/cost.md follows).
var EUWest1 = Prices{
	Region:         "eu-west-1",
	APIGatewayREST: UnitPrice{3.50e-6, "request", "https://aws.amazon.com/api-gateway/pricing/ (REST APIs, first 333 million)"},
	LambdaRequest:  UnitPrice{0.20e-6, "request", "https://aws.amazon.com/lambda/pricing/"},
	LambdaGBsArm:   UnitPrice{0.0000133334, "GB-s", "https://aws.amazon.com/lambda/pricing/ (Arm, first 7.5 billion GB-s)"},
	LambdaGBsX86:   UnitPrice{0.0000166667, "GB-s", "https://aws.amazon.com/lambda/pricing/ (x86, first 6 billion GB-s)"},
	SFNTransition:  UnitPrice{0.025e-3, "state transition", "https://aws.amazon.com/step-functions/pricing/ (Standard)"},
	SFNExpressReq:  UnitPrice{1.00e-6, "execution", "https://aws.amazon.com/step-functions/pricing/ (Express)"},
	SFNExpressGBs:  UnitPrice{0.00001667, "GB-s", "https://aws.amazon.com/step-functions/pricing/ (Express, first 1,000 GB-hours)"},
	DynamoWRU:      UnitPrice{0.7068e-6, "write request unit", "https://aws.amazon.com/dynamodb/pricing/on-demand/"},
	DynamoRRU:      UnitPrice{0.1415e-6, "read request unit", "https://aws.amazon.com/dynamodb/pricing/on-demand/"},
	DynamoStorage:  UnitPrice{0.283, "GB-month", "https://aws.amazon.com/dynamodb/pricing/on-demand/ (Standard table class)"},
	DynamoPITR:     UnitPrice{0.22, "GB-month", "https://aws.amazon.com/dynamodb/pricing/on-demand/ (continuous backups)"},
	// Standard-IA: storage 60% below Standard, reads and writes 25% above, in every region
	// (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/HowItWorks.TableClasses.html).
	DynamoWRUIA:      UnitPrice{0.8835e-6, "write request unit", "https://aws.amazon.com/dynamodb/pricing/on-demand/ (Standard-IA table class)"},
	DynamoRRUIA:      UnitPrice{0.1769e-6, "read request unit", "https://aws.amazon.com/dynamodb/pricing/on-demand/ (Standard-IA table class)"},
	DynamoStorageIA:  UnitPrice{0.1132, "GB-month", "https://aws.amazon.com/dynamodb/pricing/on-demand/ (Standard-IA table class)"},
	EventBridgeEvent: UnitPrice{1.00e-6, "event", "https://aws.amazon.com/eventbridge/pricing/ (custom events)"},
	SQSRequest:       UnitPrice{0.40e-6, "request", "https://aws.amazon.com/sqs/pricing/ (standard queue)"},
	KMSRequest:       UnitPrice{0.03e-4, "request", "https://aws.amazon.com/kms/pricing/"},
	SchedulerInvoke:  UnitPrice{1.00e-6, "invocation", "https://aws.amazon.com/eventbridge/pricing/ (Scheduler)"},
	LogsIngest:       UnitPrice{0.57, "GB", "https://aws.amazon.com/cloudwatch/pricing/ (Logs, standard class)"},
	LogsVendedIngest: UnitPrice{0.57, "GB", "https://aws.amazon.com/cloudwatch/pricing/ (vended logs, first 10 TB)"},
	LogsStorage:      UnitPrice{0.03, "GB-month", "https://aws.amazon.com/cloudwatch/pricing/ (archived)"},
	XRayTrace:        UnitPrice{5.00e-6, "trace recorded", "https://aws.amazon.com/xray/pricing/"},
}

// dynamo is a table's prices by its class.
func (p Prices) dynamo(t Table) (wru, rru, storage float64) {
	if t.Class == "STANDARD_INFREQUENT_ACCESS" {
		return p.DynamoWRUIA.USD, p.DynamoRRUIA.USD, p.DynamoStorageIA.USD
	}
	return p.DynamoWRU.USD, p.DynamoRRU.USD, p.DynamoStorage.USD
}
