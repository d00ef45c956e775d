package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/config/envvar"
)

// FloorRoute is the floor's route (env local only): the same gateway, stage and path
// parameters as a reclaim, so that the two differ only in what the function does.
const FloorRoute = "/v1/_floor/nodes/{nodeId}/reservations/{id}/reclaim"

// newFloor creates the floor function and its route, POST FloorRoute. The floor makes a
// reclaim's three calls (Query, TransactWriteItems, StartExecution) from inputs a benchmark
// precomputed, with no product logic and no authentication: whoever can call it can write
// anything to the state and audit tables, which is why only env local has it.
func (s *CapacityStack) newFloor(state, audit awsdynamodb.ITable) awslambda.Function {
	fn := s.goFunction(goFunctionSpec{Function: envvar.Floor, Environment: map[envvar.Variable]*string{
		envvar.StateMachineARN: s.Termination.StateMachineArn(),
	}})
	// What a reclaim needs of the api function's grants: the Query and the transaction's item actions.
	allow(fn, "StateTable", state, "dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem")
	allow(fn, "AuditTableAppend", audit, "dynamodb:PutItem")
	allowStateMachine(fn, "StartTermination", s.Termination, "states:StartExecution")
	integration := awsapigateway.NewLambdaIntegration(fn, &awsapigateway.LambdaIntegrationOptions{
		Proxy: jsii.Bool(true), AllowTestInvoke: jsii.Bool(false),
	})
	s.Api.Root().ResourceForPath(jsii.String(FloorRoute)).AddMethod(jsii.String("POST"), integration, nil)
	return fn
}
