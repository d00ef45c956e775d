// Command echo is the test function of the local stack: it answers every invocation with an
// API Gateway proxy response whose body is the raw event it received, so a test can see the
// event exactly as the function saw it (after the runner's corrections). It also logs each
// event to stderr, which the runner sends to the function's log file, so that asynchronous
// deliveries (EventBridge) can be observed too.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
)

type response struct {
	StatusCode int               `json:"statusCode"`
	Headers    map[string]string `json:"headers"`
	Body       string            `json:"body"`
}

func handle(_ context.Context, event json.RawMessage) (response, error) {
	fmt.Fprintf(os.Stderr, "echo event: %s\n", event)

	return response{
		StatusCode: 200,
		Headers: map[string]string{
			"Content-Type": "application/json",
			// Let the test check the environment the runner gave the function.
			"X-Function-Name": os.Getenv("AWS_LAMBDA_FUNCTION_NAME"),
			"X-Table-Name":    os.Getenv("TABLE_NAME"),
			"X-Extra":         os.Getenv("ECHO_EXTRA"),
			"X-Endpoint":      os.Getenv("AWS_ENDPOINT_URL"),
		},
		Body: string(event),
	}, nil
}

func main() {
	lambda.Start(handle)
}
