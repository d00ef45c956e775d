package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/stackname"
)

// goFunctionSpec describes a Lambda function built from ./functions/<name>: `make lambdas`
// puts its binary at <assetRoot>/<name>/bootstrap.
type goFunctionSpec struct {
	Function envvar.Function // its name (the package directory) and the variables it reads
	// Environment: besides APP_ENV, LOG_LEVEL and HISTORY_RETENTION, which goFunction sets.
	Environment map[envvar.Variable]*string
	MemoryMB    float64         // default 256
	Timeout     awscdk.Duration // default 10 s
}

type missingAssetError struct{ path string }

func (e *missingAssetError) Error() string {
	return fmt.Sprintf("lambda binary %s not found: build the functions first (make lambdas)", e.path)
}

// goFunction creates the function "capacity-<env>-<name>" (provided.al2023, arm64) under a
// construct named after it, with its own log group and a role that may only write to that log
// group; grant data access with allow. The CfnFunction carries metadata
// "capacity:function": <name>, which tells the local stack runner which package to build.
func (s *CapacityStack) goFunction(spec goFunctionSpec) awslambda.Function {
	name := spec.Function.Name()
	assetDir := filepath.Join(s.assetRoot, name)
	if st, err := os.Stat(filepath.Join(assetDir, "bootstrap")); err != nil || st.IsDir() {
		panic(&missingAssetError{path: filepath.Join(assetDir, "bootstrap")})
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = 256
	}
	if spec.Timeout == nil {
		spec.Timeout = awscdk.Duration_Seconds(jsii.Number(10))
	}
	env := map[string]*string{envvar.AppEnv.Name(): jsii.String(s.Env), envvar.LogLevel.Name(): jsii.String(s.logLevel)}
	if s.historyWindow != "" && spec.Function.Declares(envvar.HistoryRetention.Name()) {
		// Every function that writes the store's history ages it by the same window.
		env[envvar.HistoryRetention.Name()] = jsii.String(s.historyWindow)
	}
	for v, value := range spec.Environment {
		// The function would refuse to start (envvar): fail the synth instead.
		if !spec.Function.Declares(v.Name()) || v.SetBy() == envvar.Developer {
			panic(fmt.Sprintf("function %s: the stack may not set %s (see shared/config/envvar)", name, v.Name()))
		}
		env[v.Name()] = value
	}
	fnName := stackname.Function(s.Env, name)
	c := constructs.NewConstruct(s.Stack, jsii.String(constructID(name)))

	logs := s.logGroup(c, "/aws/lambda/"+fnName)
	// Instead of the AWS managed AWSLambdaBasicExecutionRole (logs:* on "*"): only this
	// function's log group (its ARN covers the group's streams).
	role := awsiam.NewRole(c, jsii.String("Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Execution role of " + fnName),
		InlinePolicies: &map[string]awsiam.PolicyDocument{
			"logs": awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{
				Statements: &[]awsiam.PolicyStatement{awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
					Sid:       jsii.String("WriteOwnLogs"),
					Actions:   jsii.Strings("logs:CreateLogStream", "logs:PutLogEvents"),
					Resources: &[]*string{logs.LogGroupArn()},
				})},
			}),
		},
	})
	fn := awslambda.NewFunction(c, jsii.String("Function"), &awslambda.FunctionProps{
		FunctionName: jsii.String(fnName),
		Description:  jsii.String("capacity " + name + " (" + s.Env + ")"),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Handler:      jsii.String("bootstrap"),
		Architecture: awslambda.Architecture_ARM_64(),
		MemorySize:   jsii.Number(spec.MemoryMB),
		Timeout:      spec.Timeout,
		Code:         awslambda.Code_FromAsset(jsii.String(assetDir), nil),
		Role:         role,
		LogGroup:     logs,
		// Lambda's own START, END and REPORT lines are INFO system logs: off, about 450 B
		// an invocation (duration and memory stay in the function's metrics; a timeout or a
		// crash is still a WARN/ERROR line). Our slog lines are JSON already.
		LoggingFormat:         awslambda.LoggingFormat_JSON,
		SystemLogLevelV2:      awslambda.SystemLogLevel_WARN,
		ApplicationLogLevelV2: applicationLogLevel(s.logLevel),
		Environment:           &env,
		// Adds xray:PutTraceSegments and xray:PutTelemetryRecords on "*" to the role.
		Tracing: awslambda.Tracing_ACTIVE,
	})
	if n, ok := s.concurrency[name]; ok {
		// Reserved: the api function keeps its share whatever else runs, and terminate-node
		// (5-40 s a call while agents brown out) cannot take the account's whole pool.
		fn.Node().DefaultChild().(awslambda.CfnFunction).SetReservedConcurrentExecutions(jsii.Number(n))
	}
	fn.Node().DefaultChild().(awslambda.CfnFunction).AddMetadata(jsii.String("capacity:function"), name)
	return fn
}

// applicationLogLevel is Lambda's filter of the function's own lines for cdk.json's logLevel,
// never above INFO: the function's slog already drops what is below LOG_LEVEL, and Lambda
// reads a line without a "level" (the EMF metric lines, shared/emf) as INFO, so a WARN filter
// would drop the metrics.
func applicationLogLevel(logLevel string) awslambda.ApplicationLogLevel {
	if logLevel == "debug" {
		return awslambda.ApplicationLogLevel_DEBUG
	}
	return awslambda.ApplicationLogLevel_INFO
}

// constructID turns a function name such as "terminate-node" into "TerminateNode".
func constructID(name string) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(name, func(r rune) bool { return r == '-' || r == '_' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}
