package main

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsscheduler"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/table"
)

// The event names (sources and detail types) are the service's own, shared/capacity's
// (events.go): the stack only routes them.

// Reclaim request intake: how long reclaim-events may run, how often a request is tried
// before it goes to the dead-letter queue, and how long either queue keeps a message.
const (
	reclaimEventsTimeoutSeconds = 60
	reclaimRequestMaxReceives   = 5
	reclaimRequestRetentionDays = 14
	// An SQS event source's batch: at most 10 requests per invocation.
	reclaimRequestBatchSize = 10
)

// newEventBus creates the environment's bus "capacity-<env>": the service publishes its events
// there, and reclaim requests arrive there.
func (s *CapacityStack) newEventBus() awsevents.EventBus {
	return awsevents.NewEventBus(s.Stack, jsii.String("EventBus"), &awsevents.EventBusProps{
		EventBusName: jsii.String(stackname.Stack(s.Env)),
		Description:  jsii.String("capacity-boundary service events and reclaim requests (" + s.Env + ")"),
	})
}

// allowPutEvents lets fn publish to the environment's bus, and to no other, with the service's
// own source only: EventBridge does not authenticate a source, this condition does, so no
// function can pass for the platform's scheduler, the fleet or a schedule firing.
func (s *CapacityStack) allowPutEvents(fn awslambda.Function) {
	fn.AddToRolePolicy(putEventsStatement("PublishEvents", s.Bus, capacity.SourceCapacity))
	s.publishers = append(s.publishers, fn.Role().RoleArn())
}

// putEventsStatement allows events:PutEvents on bus for events of source only.
func putEventsStatement(sid string, bus awsevents.IEventBus, source string) awsiam.PolicyStatement {
	return awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(sid),
		Effect:     awsiam.Effect_ALLOW,
		Actions:    jsii.Strings("events:PutEvents"),
		Resources:  &[]*string{bus.EventBusArn()},
		Conditions: &map[string]any{"StringEquals": map[string]any{"events:source": source}},
	})
}

// reclaimEventSources are the sources whose reclaim requests the intake accepts: those of the
// event principals that may reclaim, and our own schedules'.
func (s *CapacityStack) reclaimEventSources() []string {
	var sources []string
	for _, p := range s.EventPrincipals {
		if p.CanReclaim() {
			sources = append(sources, p.Source)
		}
	}
	return append(sources, capacity.SourceSchedule)
}

// topologyEventSources are the sources whose Node Topology Changed events the intake applies.
func (s *CapacityStack) topologyEventSources() []string {
	var sources []string
	for _, p := range s.EventPrincipals {
		if p.CanChangeTopology() {
			sources = append(sources, p.Source)
		}
	}
	return sources
}

// eventPrincipalsJSON is what the intake function is told of the event principals: whom each
// source acts as (capacity.ParseEventPrincipals), without the roles, which only IAM checks.
func (s *CapacityStack) eventPrincipalsJSON() string {
	list := make([]capacity.EventPrincipal, 0, len(s.EventPrincipals))
	for _, p := range s.EventPrincipals {
		list = append(list, p.EventPrincipal)
	}
	b, err := json.Marshal(list)
	if err != nil {
		panic(fmt.Sprintf("event principals: %v", err)) // plain strings and bools: cannot fail
	}
	return string(b)
}

// newBusPolicy proves each privileged source by who sends it: an explicit Deny of PutEvents
// with that source to every principal but its sender roles. An identity policy of the same
// account (PutEvents on "*") cannot override an explicit Deny, so only the configured roles can
// act as an event principal, only EventBridge Scheduler's role can fire a schedule, and only
// the service's functions can publish as the service (which tenants' rules match on).
func (s *CapacityStack) newBusPolicy() {
	type sender struct {
		source string
		roles  []*string
	}
	senders := []sender{
		{capacity.SourceCapacity, s.publishers},
		{capacity.SourceSchedule, []*string{s.SchedulerRole.RoleArn()}},
	}
	for _, p := range s.EventPrincipals {
		senders = append(senders, sender{p.Source, *jsii.Strings(p.SenderRoles...)})
	}
	// Each statement becomes an AWS::Events::EventBusPolicy of its own (one statement each).
	for i, snd := range senders {
		s.Bus.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String(fmt.Sprintf("OnlyItsSendersPut%d", i)),
			Effect:     awsiam.Effect_DENY,
			Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
			Actions:    jsii.Strings("events:PutEvents"),
			Resources:  &[]*string{s.Bus.EventBusArn()},
			Conditions: &map[string]any{
				"StringEquals": map[string]any{"events:source": snd.source},
				"ArnNotEquals": map[string]any{"aws:PrincipalArn": snd.roles},
			},
		}))
	}
}

// newOperationEventsFunction creates operation-events, the workflow task that publishes a
// reclaim operation's eviction notices (phase notice) and its outcome events (phase report).
// It derives both from the operation's items; it writes the report's claim and, after the
// report, the operation's end.
func (s *CapacityStack) newOperationEventsFunction(state awsdynamodb.ITable) awslambda.Function {
	fn := s.goFunction(goFunctionSpec{Function: envvar.OperationEvents,
		Timeout: awscdk.Duration_Seconds(jsii.Number(30)),
		Environment: map[envvar.Variable]*string{
			envvar.StateTable: state.TableName(), envvar.EventBusName: s.Bus.EventBusName(),
		}})
	// The operation item and its outcome items, read; the report's claim item (REPORT#<attempt>,
	// in the operation's partition) taken or released, so that of two runs of the report at
	// once one publishes; the operation item's end (UpdateItem) after the report, and a
	// failed one's notice items kept (UpdateItem). Operation partitions only: never a node,
	// reservation, VM or idempotency item.
	allow(fn, "StateTableRead", state, "dynamodb:GetItem", "dynamodb:Query")
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("StateTableReportClaims"),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings("dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:UpdateItem"),
		Resources: &[]*string{state.TableArn()},
		Conditions: &map[string]any{"ForAllValues:StringLike": map[string]any{
			"dynamodb:LeadingKeys": []string{table.OperationPartitions},
		}},
	}))
	s.allowPutEvents(fn)
	return fn
}

// newReclaimIntake builds the inbound path of reclaim requests and topology changes:
//
//	bus --rule capacity-<env>-reclaim-requests--> queue capacity-<env>-reclaim-requests
//	bus --rule capacity-<env>-topology-changes--> the same queue
//	  --SQS event source (batches of 10, partial batch responses)--> reclaim-events
//	  after 5 receives --> capacity-<env>-reclaim-requests-dlq (alarmed)
//
// The function refuses a bad request for good (it publishes the refusal and acknowledges
// it); only transient failures go back to the queue for another try.
func (s *CapacityStack) newReclaimIntake(state, audit, keys awsdynamodb.ITable) {
	name := stackname.Resource(s.Env, "reclaim-requests")
	c := constructs.NewConstruct(s.Stack, jsii.String("ReclaimRequests"))
	s.ReclaimRequests, s.ReclaimRequestsDeadLetters = workQueue(c, name, reclaimRequestRetentionDays,
		reclaimEventsTimeoutSeconds, reclaimRequestMaxReceives)

	// Only accepted sources reach the queue; anything else put on the bus with this detail
	// type matches no rule and is dropped by EventBridge.
	rules := []*string{}
	rule := awsevents.NewRule(c, jsii.String("Rule"), &awsevents.RuleProps{
		RuleName:    jsii.String(name),
		Description: jsii.String("Reclaim requests from the accepted sources to the intake queue (" + s.Env + ")"),
		EventBus:    s.Bus,
		EventPattern: &awsevents.EventPattern{
			Source:     jsii.Strings(s.reclaimEventSources()...),
			DetailType: jsii.Strings(capacity.DetailReclaimRequested),
		},
		// The queue policy lets this rule, and only it, send (aws:SourceArn).
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewSqsQueue(s.ReclaimRequests, nil)},
	})
	rules = append(rules, rule.RuleArn())
	// Topology changes share the queue, its retries and its dead letters: reclaim-events
	// dispatches on the detail type. No source may change topology: no rule, since a pattern
	// may not list no source.
	if topology := s.topologyEventSources(); len(topology) > 0 {
		rule := awsevents.NewRule(c, jsii.String("TopologyRule"), &awsevents.RuleProps{
			RuleName:    jsii.String(stackname.Resource(s.Env, "topology-changes")),
			Description: jsii.String("Node topology changes from the accepted sources to the intake queue (" + s.Env + ")"),
			EventBus:    s.Bus,
			EventPattern: &awsevents.EventPattern{
				Source:     jsii.Strings(topology...),
				DetailType: jsii.Strings(capacity.DetailTopologyChanged),
			},
			Targets: &[]awsevents.IRuleTarget{awseventstargets.NewSqsQueue(s.ReclaimRequests, nil)},
		})
		rules = append(rules, rule.RuleArn())
	}
	// The targets allow EventBridge to send for these rules; this denies every other sender,
	// including this account's principals whose identity policies allow sqs:SendMessage, so a
	// request cannot skip the rules (and the bus policy that proves its source). A dead-lettered
	// request is sent again through the bus, not moved back into the queue.
	s.ReclaimRequests.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheBusRulesSend"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{s.ReclaimRequests.QueueArn()},
		Conditions: &map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": rules}},
	}))

	fn := s.goFunction(goFunctionSpec{Function: envvar.ReclaimEvents,
		Timeout: awscdk.Duration_Seconds(jsii.Number(reclaimEventsTimeoutSeconds)),
		Environment: map[envvar.Variable]*string{
			envvar.StateTable: state.TableName(), envvar.AuditTable: audit.TableName(),
			envvar.StateMachineARN: s.Termination.StateMachineArn(), envvar.EventBusName: s.Bus.EventBusName(),
			// Whom each source acts as; any other source is refused (forbidden).
			envvar.EventPrincipals: jsii.String(s.eventPrincipalsJSON()),
			// Where a genuine request comes from: the function refuses any other.
			envvar.IntakeQueueARN: s.ReclaimRequests.QueueArn(), envvar.EventAccount: awscdk.Aws_ACCOUNT_ID(),
			// Where each record's receipt handle is proven (ChangeMessageVisibilityBatch).
			envvar.IntakeQueueURL: s.ReclaimRequests.QueueUrl(),
			// A scheduled reclaim's firing reads the key that scheduled it (see below).
			envvar.KeysTable: keys.TableName(),
		}})
	// Adds sqs:ReceiveMessage, ChangeMessageVisibility, GetQueueUrl, DeleteMessage and
	// GetQueueAttributes on this queue to the role.
	fn.AddEventSource(awslambdaeventsources.NewSqsEventSource(s.ReclaimRequests, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               jsii.Number(reclaimRequestBatchSize),
		ReportBatchItemFailures: jsii.Bool(true),
	}))
	// Only the function's role may receive from the queue (its event source mapping polls as
	// that role), so only a receive of its own makes a receipt handle the queue recognises:
	// reclaim-events proves each record's handle before acting (eventapi.QueueReceipts), and
	// a record made up by a direct lambda:InvokeFunction has none. An explicit Deny: no
	// identity policy of the account (sqs:* on *) can override it.
	s.ReclaimRequests.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyReclaimEventsReceives"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:ReceiveMessage"),
		Resources:  &[]*string{s.ReclaimRequests.QueueArn()},
		Conditions: &map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": []*string{fn.Role().RoleArn()}}},
	}))
	// The same reclaim as the api function's (the query, the transaction's item actions, the
	// read-back of a commit's own audit record after a lost answer, the workflow start), a
	// scheduled reclaim's move to completed or refused, which is an item of the same table,
	// and a topology change (the node, its reservations and the node's audit chain head).
	allow(fn, "StateTable", state,
		"dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem")
	// Appends (chained to the node's head, on the state table) and the read-back of a commit
	// whose answer was lost: a Query past the head it read, or a GetItem of a record's seq.
	allow(fn, "AuditTableAppendAndCheck", audit, "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query")
	allowStateMachine(fn, "StartTermination", s.Termination, "states:StartExecution")
	s.allowPutEvents(fn)
	// A scheduled reclaim's firing reads the key that scheduled it (its id pointer and the
	// key: GetItem only) and is refused if the key was revoked, expired or lost what the
	// reclaim needs. Nothing else on the keys table: no write, no Scan.
	allow(fn, "KeysTableCreatorKeyRead", keys, "dynamodb:GetItem")
	s.ReclaimEventsFunction = fn
}

// newScheduler creates the schedule group "capacity-<env>" that holds the scheduled reclaims'
// one-time schedules, and the role EventBridge Scheduler assumes to fire them: it may only
// put events on the bus, and only this account's schedules may assume it.
func (s *CapacityStack) newScheduler() {
	c := constructs.NewConstruct(s.Stack, jsii.String("Scheduling"))
	s.ScheduleGroup = awsscheduler.NewScheduleGroup(c, jsii.String("Group"), &awsscheduler.ScheduleGroupProps{
		ScheduleGroupName: jsii.String(stackname.Stack(s.Env)),
		// Deleting the group deletes its schedules: keep them with the stack's data.
		RemovalPolicy: s.removalPolicy(),
	})
	s.SchedulerRole = awsiam.NewRole(c, jsii.String("Role"), &awsiam.RoleProps{
		AssumedBy: awsiam.NewServicePrincipal(jsii.String("scheduler.amazonaws.com"), &awsiam.ServicePrincipalOpts{
			// The confused deputy: another account's schedule cannot name this role.
			Conditions: &map[string]any{"StringEquals": map[string]any{"aws:SourceAccount": awscdk.Aws_ACCOUNT_ID()}},
		}),
		Description: jsii.String("Assumed by EventBridge Scheduler to put scheduled reclaim requests on " + stackname.Stack(s.Env)),
		InlinePolicies: &map[string]awsiam.PolicyDocument{
			"events": awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{
				// The schedules' own source only: a schedule cannot pass for another principal.
				Statements: &[]awsiam.PolicyStatement{putEventsStatement("PutReclaimRequests", s.Bus, capacity.SourceSchedule)},
			}),
		},
	})
}

// schedulesArn is the ARN pattern of the schedules in the environment's group.
func (s *CapacityStack) schedulesArn() *string {
	// Pseudo parameters rather than the stack's pinned account and region: the same template
	// whether or not the environment pins them.
	return awscdk.Fn_Join(jsii.String(""), &[]*string{
		jsii.String("arn:"), awscdk.Aws_PARTITION(), jsii.String(":scheduler:"), awscdk.Aws_REGION(), jsii.String(":"),
		awscdk.Aws_ACCOUNT_ID(), jsii.String(":schedule/" + stackname.Stack(s.Env) + "/*"),
	})
}

// allowScheduling lets fn create, read and delete the schedules of the environment's group
// (and no other group's), and hand the scheduler role to EventBridge Scheduler (to nobody
// else).
func (s *CapacityStack) allowScheduling(fn awslambda.Function) {
	allowOn(fn, "ManageReclaimSchedules", s.schedulesArn(),
		"scheduler:CreateSchedule", "scheduler:DeleteSchedule", "scheduler:GetSchedule")
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("PassSchedulerRole"),
		Effect:     awsiam.Effect_ALLOW,
		Actions:    jsii.Strings("iam:PassRole"),
		Resources:  &[]*string{s.SchedulerRole.RoleArn()},
		Conditions: &map[string]any{"StringEquals": map[string]any{"iam:PassedToService": "scheduler.amazonaws.com"}},
	}))
}
