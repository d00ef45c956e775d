package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/table"
)

// DefaultAssetRoot is where `make lambdas` puts <fn>/bootstrap, relative to infra/.
const DefaultAssetRoot = "../build/lambda"

// Default stage throttling (requests per second, burst), overridable per stack.
const (
	DefaultThrottleRate  = 100
	DefaultThrottleBurst = 200
)

// apiRoutes are the REST resources proxied to the api function. Each gets method ANY: the
// function routes by method itself and answers 405 (problem+json) for a wrong one.
var apiRoutes = []string{
	"/v1/nodes/{nodeId}/reservations/{id}",                      // GET reservation
	"/v1/nodes/{nodeId}/reservations/{id}/reclaim",              // POST reclaim
	"/v1/nodes/{nodeId}/reservations/{id}/release",              // POST release to spot
	"/v1/nodes/{nodeId}/reservations/{id}/reclaims/{reclaimId}", // GET reclaim operation
	"/v1/nodes/{nodeId}/vms",                                    // POST place a spot VM
}

// stackTables are the tables the stack creates, each built from its shared/table description.
var stackTables = []table.Table{table.State, table.Audit}

var envName = regexp.MustCompile(`^[a-z][a-z0-9-]{1,15}$`)

// ValidateEnv rejects environment names that would make invalid or surprising resource names.
func ValidateEnv(env string) error {
	if !envName.MatchString(env) {
		return fmt.Errorf("invalid env %q: must match %s", env, envName)
	}
	return nil
}

// CapacityStackProps configures one environment's stack.
type CapacityStackProps struct {
	// Env names the environment: local, dev, prod, ... (see ValidateEnv).
	Env string
	// AssetRoot holds <fn>/bootstrap for every Go function. Default DefaultAssetRoot.
	AssetRoot string
	// ThrottleRate and ThrottleBurst limit the API stage. Zero means the default.
	ThrottleRate, ThrottleBurst float64
}

// CapacityStack is the service's stack for one environment.
type CapacityStack struct {
	awscdk.Stack
	Env string
	// Ephemeral environments (local, dev) are disposable: tables and logs are destroyed with
	// the stack and have no point-in-time recovery.
	Ephemeral bool
	// Tables by shared/table LogicalID.
	Tables      map[string]awsdynamodb.Table
	ApiFunction awslambda.Function
	Api         awsapigateway.RestApi

	assetRoot string
}

// NewCapacityStack builds the stack "capacity-<env>". It is environment-agnostic (no account,
// region or lookups), so synth needs no credentials.
func NewCapacityStack(scope constructs.Construct, props CapacityStackProps) (s *CapacityStack, err error) {
	if err := ValidateEnv(props.Env); err != nil {
		return nil, err
	}
	if props.AssetRoot == "" {
		props.AssetRoot = DefaultAssetRoot
	}
	if props.ThrottleRate == 0 {
		props.ThrottleRate = DefaultThrottleRate
	}
	if props.ThrottleBurst == 0 {
		props.ThrottleBurst = DefaultThrottleBurst
	}
	// goFunction reports a missing build by panicking with *missingAssetError.
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(*missingAssetError); ok {
				s, err = nil, e
				return
			}
			panic(r)
		}
	}()

	env := props.Env
	name := "capacity-" + env
	s = &CapacityStack{
		Stack: awscdk.NewStack(scope, jsii.String(name), &awscdk.StackProps{
			StackName:   jsii.String(name),
			Description: jsii.String("capacity-boundary service, env " + env),
		}),
		Env:       env,
		Ephemeral: env == "local" || env == "dev",
		Tables:    map[string]awsdynamodb.Table{},
		assetRoot: props.AssetRoot,
	}
	awscdk.Tags_Of(s.Stack).Add(jsii.String("project"), jsii.String("capacity"), nil)
	awscdk.Tags_Of(s.Stack).Add(jsii.String("env"), jsii.String(env), nil)

	for _, spec := range stackTables {
		s.Tables[spec.LogicalID] = s.newTable(spec)
	}
	state, audit := s.Tables[table.State.LogicalID], s.Tables[table.Audit.LogicalID]

	// Functions: one goFunction call each, then its grants.
	s.ApiFunction = s.goFunction(goFunctionSpec{Name: "api", Environment: map[string]*string{
		"STATE_TABLE": state.TableName(), "AUDIT_TABLE": audit.TableName(), "KEY_CACHE_TTL": jsii.String("30s"),
	}})
	// TransactWriteItems is authorised per item action (Put/Update/ConditionCheck).
	allow(s.ApiFunction, "StateTable", state,
		"dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem")
	allow(s.ApiFunction, "AuditTableAppend", audit, "dynamodb:PutItem")

	s.Api = s.newRestApi(s.ApiFunction, props.ThrottleRate, props.ThrottleBurst)

	output := func(id string, value *string, desc string) {
		awscdk.NewCfnOutput(s.Stack, jsii.String(id), &awscdk.CfnOutputProps{Value: value, Description: jsii.String(desc)})
	}
	output("ApiUrl", s.Api.Url(), "Base URL of the API stage (ends with /)")
	output("StateTableName", state.TableName(), "State table")
	output("AuditTableName", audit.TableName(), "Audit table")
	output("ApiFunctionName", s.ApiFunction.FunctionName(), "API Lambda function")
	output("Env", jsii.String(env), "Environment name")
	return s, nil
}

// removalPolicy: ephemeral environments are destroyed with their stack, others keep data.
func (s *CapacityStack) removalPolicy() awscdk.RemovalPolicy {
	if s.Ephemeral {
		return awscdk.RemovalPolicy_DESTROY
	}
	return awscdk.RemovalPolicy_RETAIN
}

// newTable builds a table from its shared description: pk/sk string keys, every index, TTL.
func (s *CapacityStack) newTable(spec table.Table) awsdynamodb.Table {
	str := func(n string) *awsdynamodb.Attribute {
		return &awsdynamodb.Attribute{Name: jsii.String(n), Type: awsdynamodb.AttributeType_STRING}
	}
	props := &awsdynamodb.TableProps{
		TableName:     jsii.String(spec.Name(s.Env)),
		PartitionKey:  str(table.PartitionKey),
		SortKey:       str(table.SortKey),
		BillingMode:   awsdynamodb.BillingMode_PAY_PER_REQUEST,
		RemovalPolicy: s.removalPolicy(),
	}
	if !s.Ephemeral {
		props.PointInTimeRecoverySpecification = &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		}
		props.DeletionProtection = jsii.Bool(true)
	}
	if spec.TTL {
		props.TimeToLiveAttribute = jsii.String(table.TTLAttribute)
	}
	t := awsdynamodb.NewTable(s.Stack, jsii.String(spec.LogicalID), props)
	for _, ix := range spec.Indexes {
		t.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
			IndexName:      jsii.String(ix.Name),
			PartitionKey:   str(ix.PartitionKey),
			SortKey:        str(ix.SortKey),
			ProjectionType: awsdynamodb.ProjectionType_ALL,
		})
	}
	return t
}

// goFunctionSpec describes a Lambda function built from ./functions/<Name>: `make lambdas`
// puts its binary at <assetRoot>/<Name>/bootstrap.
type goFunctionSpec struct {
	Name        string             // package directory under functions/, e.g. "terminate-node"
	Environment map[string]*string // besides APP_ENV and LOG_LEVEL, which every function gets
	MemoryMB    float64            // default 256
	Timeout     awscdk.Duration    // default 10 s
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
	assetDir := filepath.Join(s.assetRoot, spec.Name)
	if st, err := os.Stat(filepath.Join(assetDir, "bootstrap")); err != nil || st.IsDir() {
		panic(&missingAssetError{path: filepath.Join(assetDir, "bootstrap")})
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = 256
	}
	if spec.Timeout == nil {
		spec.Timeout = awscdk.Duration_Seconds(jsii.Number(10))
	}
	env := map[string]*string{"APP_ENV": jsii.String(s.Env), "LOG_LEVEL": jsii.String("info")}
	for k, v := range spec.Environment {
		env[k] = v
	}
	fnName := "capacity-" + s.Env + "-" + spec.Name
	c := constructs.NewConstruct(s.Stack, jsii.String(constructID(spec.Name)))

	retention := awslogs.RetentionDays_THREE_MONTHS
	if s.Ephemeral {
		retention = awslogs.RetentionDays_ONE_WEEK
	}
	logs := awslogs.NewLogGroup(c, jsii.String("LogGroup"), &awslogs.LogGroupProps{
		LogGroupName:  jsii.String("/aws/lambda/" + fnName),
		Retention:     retention,
		RemovalPolicy: s.removalPolicy(),
	})
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
		Description:  jsii.String("capacity " + spec.Name + " (" + s.Env + ")"),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Handler:      jsii.String("bootstrap"),
		Architecture: awslambda.Architecture_ARM_64(),
		MemorySize:   jsii.Number(spec.MemoryMB),
		Timeout:      spec.Timeout,
		Code:         awslambda.Code_FromAsset(jsii.String(assetDir), nil),
		Role:         role,
		LogGroup:     logs,
		Environment:  &env,
	})
	fn.Node().DefaultChild().(awslambda.CfnFunction).AddMetadata(jsii.String("capacity:function"), spec.Name)
	return fn
}

// allow grants fn exactly these actions on the table itself (not on its indexes), as one
// explicit statement with id sid. Never use grantReadWriteData & co: they add Scan, DeleteItem,
// BatchWriteItem...
func allow(fn awslambda.Function, sid string, t awsdynamodb.ITable, actions ...string) {
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String(sid),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings(actions...),
		Resources: &[]*string{t.TableArn()},
	}))
}

// newRestApi creates the REST API with a stage named after the env and every apiRoutes
// resource proxied (method ANY) to fn. No authoriser: the function checks bearer keys.
func (s *CapacityStack) newRestApi(fn awslambda.IFunction, rate, burst float64) awsapigateway.RestApi {
	api := awsapigateway.NewRestApi(s.Stack, jsii.String("RestApi"), &awsapigateway.RestApiProps{
		RestApiName:    jsii.String("capacity-" + s.Env + "-api"),
		Description:    jsii.String("capacity-boundary API (" + s.Env + ")"),
		EndpointTypes:  &[]awsapigateway.EndpointType{awsapigateway.EndpointType_REGIONAL},
		CloudWatchRole: jsii.Bool(false), // no account-wide API Gateway logging role from this stack
		DeployOptions: &awsapigateway.StageOptions{
			StageName:            jsii.String(s.Env),
			ThrottlingRateLimit:  jsii.Number(rate),
			ThrottlingBurstLimit: jsii.Number(burst),
		},
	})
	// RestApi adds an output with a hashed id; the stack's ApiUrl output replaces it.
	api.Node().TryRemoveChild(jsii.String("Endpoint"))

	integration := awsapigateway.NewLambdaIntegration(fn, &awsapigateway.LambdaIntegrationOptions{
		Proxy:           jsii.Bool(true),
		AllowTestInvoke: jsii.Bool(false), // no console test-invoke permission: one permission per route
	})
	for _, path := range apiRoutes {
		api.Root().ResourceForPath(jsii.String(path)).AddMethod(jsii.String("ANY"), integration, nil)
	}
	return api
}

// constructID turns a function name such as "terminate-node" into "TerminateNode".
func constructID(name string) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(name, func(r rune) bool { return r == '-' || r == '_' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}
