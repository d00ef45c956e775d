// Command floor is a benchmark's floor of a reclaim (see localstack/floor): behind the same API
// Gateway as the api function, it makes the same three SDK calls from precomputed inputs and
// nothing else. It has no authentication and writes what it is given, so the stack creates
// it in env local only, and it refuses to start anywhere else.
package main

import (
	"context"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/localstack/floor"
	"github.com/openrelay/capacity/shared/config"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("APP_ENV", "STATE_MACHINE_ARN"))
	if env["APP_ENV"] != "local" {
		logger.Error("configuration: the floor runs in env local only", "env", env["APP_ENV"])
		os.Exit(1)
	}
	cfg := config.Must(config.AWS(context.Background()))
	h := &floor.Handler{
		DB: dynamodb.NewFromConfig(cfg), SFN: sfn.NewFromConfig(cfg),
		StateMachineARN: env["STATE_MACHINE_ARN"], Logger: logger,
	}
	lambda.Start(h.Serve)
}
