package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/stackoutput"
	"github.com/openrelay/capacity/shared/table"
)

// newOutputs adds the stack's outputs: what the CLI, the local stack runner and operators
// look up by name.
func (s *CapacityStack) newOutputs() {
	output := func(id string, value *string, desc string) {
		awscdk.NewCfnOutput(s.Stack, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
	}
	output(stackoutput.ApiUrl, s.Api.Url(), "Base URL of the API stage (ends with /)")
	output(stackoutput.StateTableName, s.table(table.State).TableName(), "State table")
	output(stackoutput.AuditTableName, s.table(table.Audit).TableName(), "Audit table")
	output(stackoutput.KeysTableName, s.table(table.Keys).TableName(), "API keys table (managed through the api function; the first operator key is written with AWS credentials)")
	output(stackoutput.ApiFunctionName, s.ApiFunction.FunctionName(), "API Lambda function")
	output(stackoutput.StateMachineArn, s.Termination.StateMachineArn(), "Termination workflow (state machine)")
	output(stackoutput.TerminateNodeFunctionName, s.TerminateNodeFunction.FunctionName(), "Termination task Lambda function")
	output(stackoutput.ReconcilerFunctionName, s.ReconcilerFunction.FunctionName(), "Reconciler Lambda function")
	output(stackoutput.AgentMasterSecretId, s.agentMasterSecretID, "Secrets Manager secret the node agents' keys are derived from")
	output(stackoutput.AlarmTopicArn, s.AlarmTopic.TopicArn(), "SNS topic every alarm of the environment notifies")
	output(stackoutput.EventBusName, s.Bus.EventBusName(), "Event bus of the service's events and of reclaim requests")
	output(stackoutput.EventBusArn, s.Bus.EventBusArn(), "Event bus ARN")
	output(stackoutput.ReclaimRequestsQueueUrl, s.ReclaimRequests.QueueUrl(), "Queue of accepted reclaim requests (read by reclaim-events)")
	output(stackoutput.ReclaimRequestsDeadLetterQueueUrl, s.ReclaimRequestsDeadLetters.QueueUrl(), "Reclaim requests that failed every try")
	output(stackoutput.ScheduleGroupName, s.ScheduleGroup.ScheduleGroupName(), "EventBridge Scheduler group of the scheduled reclaims")
	output(stackoutput.ReclaimEventsFunctionName, s.ReclaimEventsFunction.FunctionName(), "Reclaim request Lambda function (SQS)")
	output(stackoutput.OperationEventsFunctionName, s.OperationEventsFunction.FunctionName(), "Workflow task Lambda function that publishes notices and reports")
	output(stackoutput.Env, jsii.String(s.Env), "Environment name")
}
