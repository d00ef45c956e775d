// Command termination-steps runs the termination workflow's later steps: the
// termination-steps queue delivers each round (the first after the grace, each retry after
// the retry wait) as a message whose delay was the wait, and the function starts an Express
// run of it. A step that arrives early (more than a second before its dueAt) goes back to the
// queue with the delay left. Handler: stepfn.StepRunner.
//
// Environment: envvar.TerminationSteps.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	s, logger, cfg := config.Start(envvar.TerminationSteps, readSettings)
	lambda.Start((&stepfn.StepRunner{
		Executions: sfn.NewFromConfig(cfg), StateMachineARN: s.stateMachineARN,
		Queue: sqs.NewFromConfig(cfg), QueueURL: s.queueURL,
		Logger: logger,
	}).Handle)
}

// settings are the function's configuration (envvar.TerminationSteps).
type settings struct {
	config.Common
	stateMachineARN, queueURL string
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	return settings{
		Common:          config.ReadCommon(e),
		stateMachineARN: envvar.StateMachineARN.Get(e),
		queueURL:        envvar.TerminationStepsQueueURL.Get(e),
	}
}
