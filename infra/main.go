// Command infra is the CDK app of the capacity-boundary service: one stack per environment.
//
//	cdk synth -c env=local|dev|staging|prod [-c assetRoot=DIR]
//
// Each environment is configured in one place, cdk.json context "environments" (see
// EnvConfig): an unknown environment or a missing or invalid value fails synth.
//
// cdk.json builds it into build/cdk-app and runs it from the repo root (the CLI passes a
// relative output dir, so the app must run where cdk does). The Lambda binaries come from
// <repo>/build/lambda/<fn>/bootstrap (make lambdas) unless assetRoot says otherwise.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "infra:", err)
		os.Exit(1)
	}
}

func run() error {
	defer jsii.Close()
	app := awscdk.NewApp(nil)

	env, err := contextString(app, "env", LocalEnv)
	if err != nil {
		return err
	}
	assetRoot, err := contextString(app, "assetRoot", defaultAssetRoot())
	if err != nil {
		return err
	}
	props, err := StackPropsFor(app.Node().TryGetContext(jsii.String(EnvironmentsContextKey)), env)
	if err != nil {
		return err
	}
	props.AssetRoot = assetRoot
	if _, err := NewCapacityStack(app, props); err != nil {
		return err
	}
	app.Synth(nil)
	return nil
}

// defaultAssetRoot is <repo>/build/lambda, the repo being the nearest directory up from the
// working directory that holds cdk.json; DefaultAssetRoot if there is none.
func defaultAssetRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return DefaultAssetRoot
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "cdk.json")); err == nil {
			return filepath.Join(dir, "build", "lambda")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return DefaultAssetRoot
		}
		dir = parent
	}
}

func contextString(app awscdk.App, key, def string) (string, error) {
	switch v := app.Node().TryGetContext(jsii.String(key)).(type) {
	case nil:
		return def, nil
	case string:
		if v == "" {
			return def, nil
		}
		return v, nil
	default:
		return "", fmt.Errorf("context %s: want a string, got %v", key, v)
	}
}
