// Package stackoutput names the stack's CloudFormation outputs: infra declares them under
// these names, and the local stack runner and capacityctl look them up by them. It imports
// only the standard library, so that infra may import it.
package stackoutput

// The outputs, by name.
const (
	ApiUrl                            = "ApiUrl"
	StateTableName                    = "StateTableName"
	AuditTableName                    = "AuditTableName"
	KeysTableName                     = "KeysTableName"
	ApiFunctionName                   = "ApiFunctionName"
	StateMachineArn                   = "StateMachineArn"
	TerminateNodeFunctionName         = "TerminateNodeFunctionName"
	ReconcilerFunctionName            = "ReconcilerFunctionName"
	AgentMasterSecretId               = "AgentMasterSecretId"
	AlarmTopicArn                     = "AlarmTopicArn"
	EventBusName                      = "EventBusName"
	EventBusArn                       = "EventBusArn"
	ReclaimRequestsQueueUrl           = "ReclaimRequestsQueueUrl"
	ReclaimRequestsDeadLetterQueueUrl = "ReclaimRequestsDeadLetterQueueUrl"
	ScheduleGroupName                 = "ScheduleGroupName"
	ReclaimEventsFunctionName         = "ReclaimEventsFunctionName"
	OperationEventsFunctionName       = "OperationEventsFunctionName"
	Env                               = "Env"
)

// AgentSimulatorUrl is the local stack's node agent simulator (make run): the runner writes it
// into .local/outputs.json beside the stack's outputs. It is not an output of the
// CloudFormation stack, so it is not in All.
const AgentSimulatorUrl = "AgentSimulatorUrl"

// All are every output's name (infra's TestOutputs checks the stack has exactly these).
var All = []string{
	ApiUrl, StateTableName, AuditTableName, KeysTableName, ApiFunctionName, StateMachineArn,
	TerminateNodeFunctionName, ReconcilerFunctionName, AgentMasterSecretId, AlarmTopicArn, EventBusName,
	EventBusArn, ReclaimRequestsQueueUrl, ReclaimRequestsDeadLetterQueueUrl, ScheduleGroupName,
	ReclaimEventsFunctionName, OperationEventsFunctionName, Env,
}
