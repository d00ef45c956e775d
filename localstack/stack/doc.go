// Package stack runs the service's CloudFormation stack on one machine, offline: it serves
// the Go AWS emulator github.com/sivchari/kumo (used as a library) behind a reverse proxy on
// 127.0.0.1:4566 and provisions it from the template that `cdk synth -c env=local` writes,
// with SDK calls, because kumo's CloudFormation creates nothing.
//
// Provisioned from the template:
//   - AWS::DynamoDB::Table and AWS::DynamoDB::GlobalTable: keys, attribute definitions, GSIs,
//     LSIs, billing mode, streams, and TTL (UpdateTimeToLive).
//   - AWS::Lambda::Function: registered with CreateFunction (kumo does not run code). A function
//     whose Metadata has "capacity:function": "<name>" gets its real Go bootstrap built for the
//     host from ./functions/<name> and Options.Processes copies of it attached to kumo's Lambda
//     runtime API, so invocations from API Gateway, Step Functions, EventBridge and the SDK run
//     the product code.
//   - AWS::ApiGateway::RestApi, Resource, Method (+ integration), Deployment, Stage.
//   - AWS::StepFunctions::StateMachine (DefinitionString or Definition, with substitutions).
//   - AWS::Events::EventBus, AWS::Events::Rule (+ targets).
//   - AWS::SecretsManager::Secret: SecretString, or a value generated as GenerateSecretString
//     asks; Ref is its ARN, and ReadSecret reads it back. kumo's Secrets Manager keeps every
//     earlier AWSCURRENT as AWSPREVIOUS on PutSecretValue (AWS moves AWSPREVIOUS to the one
//     just replaced), so after two rotations GetSecretValue(AWSPREVIOUS) may return either.
//
// Skipped, because nothing local depends on them (they still get fake physical ids and ARNs so
// that references to them resolve): AWS::IAM::*, AWS::Lambda::Permission, AWS::Logs::LogGroup,
// AWS::ApiGateway::Account, AWS::CDK::Metadata, CDK's bootstrap Parameters and Rules, and
// alarming, since nothing local notifies or graphs: AWS::SNS::Topic, Subscription and
// TopicPolicy, AWS::KMS::Key and Alias, AWS::CloudWatch::Alarm and Dashboard. The stage's
// tracing and access-log settings and the functions' TracingConfig are ignored likewise.
// Any other resource type is skipped with a warning naming it.
//
// The proxy in front of kumo corrects what would otherwise make local runs differ from AWS:
//   - kumo puts the resource template ("/items/{id}") in a REST proxy event's path; the proxy
//     rewrites the event on its way to the function so path holds the real request path.
//   - kumo serves an API only on the {apiId}.execute-api.localhost host; the proxy also accepts
//     LocalStack's path form http://127.0.0.1:4566/restapis/{apiId}/{stage}/_user_request_/...,
//     and the ApiUrl-style outputs use that form, so no wildcard DNS is needed.
//
// Only one stack can hold an address. A stack started by a test binary says so in a small file
// in the temp dir; another Start that finds the address busy waits for such a stack to stop
// (go test runs packages in parallel, and every end-to-end package needs 127.0.0.1:4566), and
// fails at once if anything else holds it.
//
// Limits that come from kumo: its services are process-wide singletons, so Start works once
// per process; its Step Functions call Lambda at a hard-coded http://localhost:4566, so a stack
// that runs workflows must listen on port 4566; EventBridge schedules never fire; rules with
// Step Functions targets are not delivered. The package is for Unix hosts (process groups).
package stack
