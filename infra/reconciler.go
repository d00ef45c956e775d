package main

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/table"
)

// newReconcilerFunction creates the reconciler, which starts again the workflows that a
// crash, a throttle or a lost step left unstarted, restarts the operations that made no
// progress, and reports and ends the operations whose Report step a cut-off run left out.
func (s *CapacityStack) newReconcilerFunction() awslambda.Function {
	state := s.table(table.State)
	fn := s.goFunction(goFunctionSpec{Function: envvar.Reconciler,
		Timeout: awscdk.Duration_Seconds(jsii.Number(60)),
		Environment: map[envvar.Variable]*string{
			envvar.StateTable: state.TableName(), envvar.StateMachineARN: s.Termination.StateMachineArn(),
			// The function's defaults, written out so that the console shows them.
			envvar.StartAfter:   jsii.String(envvar.StartAfter.DefaultText()),
			envvar.StuckAfter:   jsii.String(envvar.StuckAfter.DefaultText()),
			envvar.HeldAfter:    jsii.String(envvar.FormatDuration(capacity.DefaultHeldAfter)),
			envvar.EventBusName: s.Bus.EventBusName(),
			envvar.StartRate:    jsii.String(fmt.Sprint(s.reconcilerStartRate())),
		}})
	// Finds operations by state (byState index), reads each one with its outcomes and report
	// claims (Query on the table), starts or restarts its attempt, ends, restarts or fails the
	// operation item with conditional updates, and takes, marks done or releases an attempt's
	// report claim (REPORT#<attempt>: put, update, delete). It never asks what became of an
	// execution (an Express run cannot be described): no states:DescribeExecution. Metrics go
	// out as embedded-metric-format log lines, so no cloudwatch:PutMetricData. On the table it
	// reaches operation partitions only (the operation item, its outcomes, whose expiry it
	// extends or removes from a failed one that holds VMs, and its claims): never a node,
	// reservation, VM or idempotency item, so a compromised reconciler cannot move capacity or
	// its audit head.
	allowIndex(fn, "StateByStateIndex", state, table.ByStateIndex, "dynamodb:Query")
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("StateTableOperations"),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings("dynamodb:DeleteItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"),
		Resources: &[]*string{state.TableArn()},
		Conditions: &map[string]any{"ForAllValues:StringLike": map[string]any{
			"dynamodb:LeadingKeys": []string{table.OperationPartitions},
		}},
	}))
	allowStateMachine(fn, "StartTermination", s.Termination, "states:StartExecution")
	// Publishes an operation's report before it ends or fails the operation itself (an
	// operation whose Report step never came, one whose restarts are spent).
	s.allowPutEvents(fn)
	return fn
}

// newReconcileSchedule runs the reconciler every minute. The local stack runner creates
// schedule rules disabled (kumo never fires them); invoke the reconciler yourself there.
func (s *CapacityStack) newReconcileSchedule() {
	awsevents.NewRule(s.Stack, jsii.String("ReconcileSchedule"), &awsevents.RuleProps{
		RuleName:    jsii.String(stackname.Resource(s.Env, "reconcile")),
		Description: jsii.String("Runs the capacity reconciler every minute (" + s.Env + ")"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(s.ReconcilerFunction, &awseventstargets.LambdaFunctionProps{
			// The next tick is a minute away: a retried or stale tick only doubles the work.
			RetryAttempts: jsii.Number(0),
			MaxEventAge:   awscdk.Duration_Minutes(jsii.Number(1)),
		})},
	})
}

// reconcilerStartRate is the environment's START_RATE, written out when it is the default.
func (s *CapacityStack) reconcilerStartRate() int {
	if s.startRate > 0 {
		return int(s.startRate)
	}
	return capacity.DefaultStartRate
}
