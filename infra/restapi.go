package main

import (
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsapigateway"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/stackname"
	"github.com/openrelay/capacity/shared/table"
)

// apiRoutes are the REST resources proxied to the api function: the paths of the one route
// table, shared/routes, that the function's mux is built from too. Each gets method ANY: the
// function routes by method itself and answers 405 (problem+json) for a wrong one.
var apiRoutes = routes.Paths()

// newApiFunction creates the api function behind every REST route: the capacity calls, the
// operator's calls, scheduled reclaims and API keys. maxPendingScheduled caps an org's pending
// scheduled reclaims; rate is each API key's rate limit.
func (s *CapacityStack) newApiFunction(maxPendingScheduled int, rate capacity.RateLimit) awslambda.Function {
	state, audit, keys, limits := s.table(table.State), s.table(table.Audit), s.table(table.Keys), s.table(table.Limits)
	env := map[envvar.Variable]*string{
		envvar.StateTable: state.TableName(), envvar.AuditTable: audit.TableName(),
		envvar.KeysTable: keys.TableName(), envvar.KeyCacheTTL: jsii.String(envvar.KeyCacheTTL.DefaultText()),
		envvar.StateMachineARN: s.Termination.StateMachineArn(),
		// Scheduled reclaims: one-time schedules in this group put a request on the bus as this role.
		envvar.ScheduleGroup: s.ScheduleGroup.ScheduleGroupName(), envvar.ScheduleRoleARN: s.SchedulerRole.RoleArn(),
		envvar.EventBusARN:               s.Bus.EventBusArn(),
		envvar.MaxPendingScheduledPerOrg: jsii.String(strconv.Itoa(maxPendingScheduled)),
		// Each key's rate limit, kept in the limits table.
		envvar.LimitsTable: limits.TableName(),
		// (shared/config.RateLimit reads them.)
		envvar.RateLimitPerSecond: jsii.String(strconv.FormatFloat(rate.PerSecond, 'f', -1, 64)),
		envvar.RateLimitBurst:     jsii.String(strconv.Itoa(rate.Burst)),
		// Registration, an owner change and a rotation make a node a random agent key,
		// sealed under this key, and hand it out once.
		envvar.AgentKeysKMSKeyID: s.AgentKeysKey.KeyArn(),
	}
	if s.Env == LocalEnv {
		// The local stack's agents listen on loopback, over plain http: a node may be
		// registered with an http endpoint there, and nowhere else.
		env[envvar.AgentAllowHTTP] = jsii.String("true")
	}
	fn := s.goFunction(goFunctionSpec{Function: envvar.API, Environment: env})
	// TransactWriteItems is authorised per item action (Put/Update/ConditionCheck/Delete).
	// Nodes, reservations and their topology changes are writes of the same kinds; the node
	// item also carries its audit chain's head. BatchGetItem: an org's reservations list
	// reads the reservations its membership entry lists.
	allow(fn, "StateTable", state,
		"dynamodb:Query", "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem")
	// DeleteItem: an operator's force-end moves the VM it ends from the node's decision
	// partition to its history (a conditional delete and a put in its transaction), and the
	// api deletes nothing else. IAM cannot name a sort key, so the reach is the partition:
	// NODE#<id> and nothing under it (no operation, outcome, claim, history or audit item),
	// nor any list, key or schedule partition.
	deleteIn := func(sid string, effect awsiam.Effect, cond, pattern string) {
		fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid: jsii.String(sid), Effect: effect, Actions: jsii.Strings("dynamodb:DeleteItem"),
			Resources:  &[]*string{state.TableArn()},
			Conditions: &map[string]any{cond: map[string]any{"dynamodb:LeadingKeys": []string{pattern}}},
		}))
	}
	deleteIn("StateTableForceEndDelete", awsiam.Effect_ALLOW, "ForAllValues:StringLike", table.NodePartitions)
	deleteIn("StateTableNoDeleteUnderNodes", awsiam.Effect_DENY, "ForAnyValue:StringLike", table.NodeSubPartitions)
	// Appends only (no Update or Delete). GetItem and Query: after a commit whose answer was
	// lost, the service reads the commit's own audit record to learn whether it landed; and
	// the audit of a node (the table) and of a reservation (its index, keys only: BatchGetItem
	// then reads the page's records).
	allow(fn, "AuditTableAppendAndRead", audit, "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchGetItem")
	allowIndex(fn, "AuditByReservationIndex", audit, table.AuditByReservationIndex, "dynamodb:Query")
	// A reservation's scheduled reclaims are listed from the state table's byState index.
	allowIndex(fn, "StateByStateIndex", state, table.ByStateIndex, "dynamodb:Query")
	// The node view's lists (the nodes a caller may see, a reservation's reclaims) read the
	// state table's byList index.
	allowIndex(fn, "StateByListIndex", state, table.ByListIndex, "dynamodb:Query")
	// API keys: the lookup of a bearer key (GetItem), and the operator's key management:
	// create (a transaction of Puts, the key chain's head Update and ConditionChecks), list
	// (Scan), revoke and the last-use time (UpdateItem). Only reclaim-events also reads it,
	// and no role may delete a key: a revoked key stays, marked, for its audit.
	allow(fn, "KeysTable", keys,
		"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Scan", "dynamodb:ConditionCheckItem")
	// Rate limits: one conditional UpdateItem (two at most) of the calling key's own item per
	// call, which also tells the stored state when its condition fails; no read, no delete
	// (TTL removes idle items). No other role reaches the table.
	allow(fn, "LimitsTable", limits, "dynamodb:UpdateItem")
	// Seals the agent keys it makes, and can open none: no kms:Decrypt here, no read of the
	// master secret, and the key's policy denies this role Decrypt (denyAgentKeysOpen), so
	// whoever takes over the internet-facing function obtains no existing node's key.
	s.allowAgentKeys(fn, "AgentKeysSeal", "kms:Encrypt")
	s.denyAgentKeysOpen(fn)
	allowStateMachine(fn, "StartTermination", s.Termination, "states:StartExecution")
	s.allowScheduling(fn)
	return fn
}

// newRestApi creates the REST API with a stage named after the env and every apiRoutes
// resource proxied (method ANY) to fn. No authoriser: the function checks bearer keys.
func (s *CapacityStack) newRestApi(fn awslambda.IFunction, rate, burst float64) awsapigateway.RestApi {
	api := awsapigateway.NewRestApi(s.Stack, jsii.String("RestApi"), &awsapigateway.RestApiProps{
		RestApiName:   jsii.String(stackname.Resource(s.Env, "api")),
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
				s.logGroup(constructs.NewConstruct(s.Stack, jsii.String("ApiAccessLogs")), "/aws/apigateway/"+stackname.Resource(s.Env, "api-access"))),
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
	// The web console: GET only, no key (the page asks for one); the function serves the
	// files it embeds (docs/console.md).
	for _, r := range routes.Console {
		api.Root().ResourceForPath(jsii.String(r.Path)).AddMethod(jsii.String(r.Method), integration, nil)
	}
	return api
}
