package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/table"
)

// newOutputs adds the stack's outputs: what the CLI, the local stack runner and operators
// look up by name.
func (s *CapacityStack) newOutputs() {
	output := func(id string, value *string, desc string) {
		awscdk.NewCfnOutput(s.Stack, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
	}
	output("ApiUrl", s.Api.Url(), "Base URL of the API stage (ends with /)")
	output("StateTableName", s.table(table.State).TableName(), "State table")
	output("AuditTableName", s.table(table.Audit).TableName(), "Audit table")
	output("KeysTableName", s.table(table.Keys).TableName(), "API keys table (managed through the api function; the first operator key is written with AWS credentials)")
	output("ApiFunctionName", s.ApiFunction.FunctionName(), "API Lambda function")
	output("StateMachineArn", s.Termination.StateMachineArn(), "Termination workflow (state machine)")
	output("TerminateNodeFunctionName", s.TerminateNodeFunction.FunctionName(), "Termination task Lambda function")
	output("ReconcilerFunctionName", s.ReconcilerFunction.FunctionName(), "Reconciler Lambda function")
	output("AgentMasterSecretId", s.agentMasterSecretID, "Secrets Manager secret the node agents' keys are derived from")
	output("AlarmTopicArn", s.AlarmTopic.TopicArn(), "SNS topic every alarm of the environment notifies")
	output("EventBusName", s.Bus.EventBusName(), "Event bus of the service's events and of reclaim requests")
	output("EventBusArn", s.Bus.EventBusArn(), "Event bus ARN")
	output("ReclaimRequestsQueueUrl", s.ReclaimRequests.QueueUrl(), "Queue of accepted reclaim requests (read by reclaim-events)")
	output("ReclaimRequestsDeadLetterQueueUrl", s.ReclaimRequestsDeadLetters.QueueUrl(), "Reclaim requests that failed every try")
	output("ScheduleGroupName", s.ScheduleGroup.ScheduleGroupName(), "EventBridge Scheduler group of the scheduled reclaims")
	output("ReclaimEventsFunctionName", s.ReclaimEventsFunction.FunctionName(), "Reclaim request Lambda function (SQS)")
	output("OperationEventsFunctionName", s.OperationEventsFunction.FunctionName(), "Workflow task Lambda function that publishes notices and reports")
	output("Env", jsii.String(s.Env), "Environment name")
}
