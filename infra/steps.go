package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
)

// The termination steps' queue and its consumer: how long termination-steps may run, how
// often a step is tried before it is dead-lettered, how long a step is kept, and the batch.
const (
	terminationStepsTimeoutSeconds = 30
	terminationStepMaxReceives     = 5
	terminationStepRetentionDays   = 4
	terminationStepsBatchSize      = 10
)

// newTerminationStepsQueue creates "capacity-<env>-termination-steps", the queue of the
// workflow's later steps (each round, held back by its message's delay: the grace left, or
// the retry wait), and its dead-letter queue "...-dlq" (after 5 receives; alarmed). Who may
// send to it is set by newTerminationStepsFunction, once both senders exist.
func (s *CapacityStack) newTerminationStepsQueue() {
	name := stackname.Resource(s.Env, "termination-steps")
	c := constructs.NewConstruct(s.Stack, jsii.String("TerminationStepQueue"))
	s.TerminationSteps, s.TerminationStepsDeadLetters = workQueue(c, name, terminationStepRetentionDays,
		terminationStepsTimeoutSeconds, terminationStepMaxReceives)
}

// newTerminationStepsFunction creates termination-steps, which starts an Express run of each
// step the queue delivers (or sends an early one back with the delay left), and the queue's
// policy: only the state machine's role and this function may send to it.
func (s *CapacityStack) newTerminationStepsFunction() awslambda.Function {
	q := s.TerminationSteps
	fn := s.goFunction(goFunctionSpec{Function: envvar.TerminationSteps, MemoryMB: 128,
		Timeout: awscdk.Duration_Seconds(jsii.Number(terminationStepsTimeoutSeconds)),
		Environment: map[envvar.Variable]*string{
			envvar.StateMachineARN: s.Termination.StateMachineArn(), envvar.TerminationStepsQueueURL: q.QueueUrl(),
		}})
	// Adds sqs:ReceiveMessage, ChangeMessageVisibility, GetQueueUrl, DeleteMessage and
	// GetQueueAttributes on this queue (and no other) to the role.
	fn.AddEventSource(awslambdaeventsources.NewSqsEventSource(q, &awslambdaeventsources.SqsEventSourceProps{
		BatchSize:               jsii.Number(terminationStepsBatchSize),
		ReportBatchItemFailures: jsii.Bool(true),
	}))
	// An early step goes back to the queue; every step that is due starts a run.
	allowOn(fn, "HoldEarlyStepsBack", q.QueueArn(), "sqs:SendMessage")
	allowStateMachine(fn, "StartTermination", s.Termination, "states:StartExecution")

	// Identity policies of this account could allow sqs:SendMessage on any queue; this denies
	// every sender but the two, so no other principal can make a round run (or run early).
	q.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("OnlyTheWorkflowAndItsStepsSend"),
		Effect:     awsiam.Effect_DENY,
		Principals: &[]awsiam.IPrincipal{awsiam.NewAnyPrincipal()},
		Actions:    jsii.Strings("sqs:SendMessage"),
		Resources:  &[]*string{q.QueueArn()},
		Conditions: &map[string]any{"ArnNotEquals": map[string]any{
			"aws:PrincipalArn": []*string{s.Termination.Role().RoleArn(), fn.Role().RoleArn()},
		}},
	}))
	return fn
}

// workQueue creates the queue name, consumed by a function of timeout consumerTimeout
// seconds, and its dead-letter queue "<name>-dlq" (after maxReceives receives): both
// encrypted by SQS, TLS only, keeping a message retentionDays. A message's age counts from
// its first enqueue, in the dead-letter queue too: the same retention there leaves days to
// look at it after its last try. The visibility timeout is six times the consumer's timeout
// (AWS's advice for an SQS event source), so a batch still in flight, and its retries of
// throttled polls, is not delivered twice.
func workQueue(c constructs.Construct, name string, retentionDays, consumerTimeout, maxReceives float64) (queue, deadLetters awssqs.Queue) {
	retention := awscdk.Duration_Days(jsii.Number(retentionDays))
	deadLetters = awssqs.NewQueue(c, jsii.String("DeadLetterQueue"), &awssqs.QueueProps{
		QueueName:       jsii.String(name + "-dlq"),
		Encryption:      awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:      jsii.Bool(true),
		RetentionPeriod: retention,
	})
	queue = awssqs.NewQueue(c, jsii.String("Queue"), &awssqs.QueueProps{
		QueueName:         jsii.String(name),
		Encryption:        awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		RetentionPeriod:   retention,
		VisibilityTimeout: awscdk.Duration_Seconds(jsii.Number(6 * consumerTimeout)),
		DeadLetterQueue:   &awssqs.DeadLetterQueue{Queue: deadLetters, MaxReceiveCount: jsii.Number(maxReceives)},
	})
	return queue, deadLetters
}
