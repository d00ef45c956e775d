package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/routes"
)

// apiRoutes are the REST resources proxied to the api function: the paths of the one route
// table, shared/routes, that the function's mux is built from too. Each gets method ANY: the
// function routes by method itself and answers 405 (problem+json) for a wrong one.
var apiRoutes = routes.Paths()

// newRestApi creates the REST API with a stage named after the env and every apiRoutes
// resource proxied (method ANY) to fn. No authoriser: the function checks bearer keys.
func (s *CapacityStack) newRestApi(fn awslambda.IFunction, rate, burst float64) awsapigateway.RestApi {
	api := awsapigateway.NewRestApi(s.Stack, jsii.String("RestApi"), &awsapigateway.RestApiProps{
		RestApiName:   jsii.String("capacity-" + s.Env + "-api"),
		Description:   jsii.String("capacity-boundary API (" + s.Env + ")"),
		EndpointTypes: &[]awsapigateway.EndpointType{awsapigateway.EndpointType_REGIONAL},
		// Access and execution logs need the account's API Gateway CloudWatch role. Each
		// environment has an account of its own; the setting is the account's, and other APIs
		// may rely on it, so the role outlives the stack.
		CloudWatchRole:              jsii.Bool(true),
		CloudWatchRoleRemovalPolicy: awscdk.RemovalPolicy_RETAIN,
		DeployOptions: &awsapigateway.StageOptions{
			StageName:            jsii.String(s.Env),
			ThrottlingRateLimit:  jsii.Number(rate),
			ThrottlingBurstLimit: jsii.Number(burst),
			TracingEnabled:       jsii.Bool(true),
			AccessLogDestination: awsapigateway.NewLogGroupLogDestination(
				s.logGroup(constructs.NewConstruct(s.Stack, jsii.String("ApiAccessLogs")), "/aws/apigateway/capacity-"+s.Env+"-api-access")),
			AccessLogFormat: accessLogFormat(),
			// Execution logs (API-Gateway-Execution-Logs_<api>/<stage>) for errors only, never bodies.
			LoggingLevel:     awsapigateway.MethodLoggingLevel_ERROR,
			DataTraceEnabled: jsii.Bool(false),
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
