// Command infra is the CDK app of the capacity-boundary service: one stack per environment.
//
//	cdk synth -c env=local|dev|prod [-c assetRoot=DIR] [-c throttleRate=N -c throttleBurst=N]
//	          [-c terminateConcurrency=N] [-c terminateRounds=N] [-c terminateRetryWait=SECONDS]
//
// cdk.json builds it into build/cdk-app and runs it from the repo root (the CLI passes a
// relative output dir, so the app must run where cdk does). The Lambda binaries come from
// <repo>/build/lambda/<fn>/bootstrap (make lambdas) unless assetRoot says otherwise.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

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

	env, err := contextString(app, "env", "local")
	if err != nil {
		return err
	}
	assetRoot, err := contextString(app, "assetRoot", defaultAssetRoot())
	if err != nil {
		return err
	}
	rate, err := contextNumber(app, "throttleRate")
	if err != nil {
		return err
	}
	burst, err := contextNumber(app, "throttleBurst")
	if err != nil {
		return err
	}
	masterSecret, err := contextString(app, "agentMasterSecret", "")
	if err != nil {
		return err
	}
	props := CapacityStackProps{Env: env, AssetRoot: assetRoot, ThrottleRate: rate, ThrottleBurst: burst,
		AgentMasterSecretName: masterSecret}
	for key, dst := range map[string]*float64{
		"terminateConcurrency": &props.TerminateConcurrency,
		"terminateRounds":      &props.TerminateRounds,
		"terminateRetryWait":   &props.TerminateRetryWait,
	} {
		if *dst, err = contextNumber(app, key); err != nil {
			return err
		}
	}
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

// contextNumber reads an optional positive number; 0 when absent.
func contextNumber(app awscdk.App, key string) (float64, error) {
	var n float64
	switch v := app.Node().TryGetContext(jsii.String(key)).(type) {
	case nil:
		return 0, nil
	case float64:
		n = v
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("context %s: %w", key, err)
		}
		n = f
	default:
		return 0, fmt.Errorf("context %s: want a number, got %v", key, v)
	}
	if n <= 0 {
		return 0, fmt.Errorf("context %s: want a positive number, got %v", key, n)
	}
	return n, nil
}
