// Command floor is a benchmark's floor of a reclaim (see localstack/floor): behind the same API
// Gateway as the api function, it makes the same three SDK calls from precomputed inputs and
// nothing else. It has no authentication and writes what it is given, so the stack creates
// it in env local only, and it refuses to start anywhere else.
package main

import (
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/localstack/floor"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/config/envvar"
)

func main() {
	s, logger, cfg := config.Start(envvar.Floor, readSettings)
	if s.AppEnv != "local" {
		logger.Error("configuration: the floor runs in env local only", "env", s.AppEnv)
		os.Exit(1)
	}
	h := &floor.Handler{
		DB: dynamodb.NewFromConfig(cfg), SFN: sfn.NewFromConfig(cfg),
		StateMachineARN: s.stateMachineARN, Logger: logger,
	}
	lambda.Start(h.Serve)
}

// settings are the function's configuration (envvar.Floor).
type settings struct {
	config.Common
	stateMachineARN string
}

// readSettings reads the function's configuration; errors go to e.
func readSettings(e *envvar.Env) settings {
	s := settings{Common: config.ReadCommon(e), stateMachineARN: envvar.StateMachineARN.Get(e)}
	return s
}
