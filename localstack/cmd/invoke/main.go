// Command invoke sends a sample event to a function of the local stack and prints its answer
// (`make invoke FN=api EVENT=events/reclaim-dry-run.json`).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/stackname"
)

func main() {
	fn := flag.String("fn", "api", "function, by its folder under functions/")
	event := flag.String("event", "", "JSON file with the event")
	env := flag.String("env", "local", "environment the stack was synthesised for")
	endpoint := flag.String("endpoint", "http://127.0.0.1:4566", "local endpoint")
	flag.Parse()
	if err := invoke(context.Background(), *endpoint, stackname.Function(*env, *fn), *event); err != nil {
		fmt.Fprintln(os.Stderr, "invoke:", err)
		os.Exit(1)
	}
}

func invoke(ctx context.Context, endpoint, function, eventPath string) error {
	payload, err := os.ReadFile(eventPath)
	if err != nil {
		return fmt.Errorf("read event: %w", err)
	}
	client := lambda.NewFromConfig(stack.AWSConfig(endpoint))
	out, err := client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(function), Payload: payload})
	if err != nil {
		return fmt.Errorf("invoke %s (is `make run` running?): %w", function, err)
	}
	if out.FunctionError != nil {
		return fmt.Errorf("%s failed (%s): %s", function, aws.ToString(out.FunctionError), out.Payload)
	}
	fmt.Println(string(out.Payload))
	return nil
}
