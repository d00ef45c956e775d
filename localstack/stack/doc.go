// Package stack runs the service's CloudFormation stack on one machine, offline: it serves
// the Go AWS emulator github.com/sivchari/kumo (used as a library) behind a reverse proxy on
// 127.0.0.1:4566 (or Options.Addr) and provisions it from the template that `cdk synth -c env=local` writes,
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
//   - AWS::Events::EventBus, AWS::Events::Rule (+ targets; kumo delivers to Lambda and SQS
//     targets).
//   - AWS::SQS::Queue: visibility timeout, retention, delay, size, wait, FIFO and RedrivePolicy
//     (kumo moves a message received more than maxReceiveCount times to the dead-letter queue);
//     Ref is the queue URL. KmsMasterKeyId and SqsManagedSseEnabled are accepted and dropped
//     (kumo keeps messages in memory). AWS::SQS::QueuePolicy is applied, but kumo evaluates no
//     policy, so its deny of non-TLS access does not stop the local plain HTTP.
//   - AWS::Lambda::EventSourceMapping: registered in kumo, which never polls it, so the runner
//     polls each SQS mapping itself, as Lambda does: Options.Processes pollers receive up to
//     BatchSize messages, invoke the function synchronously (SDK Invoke, the same path as
//     `make invoke`) with an events.SQSEvent, and delete what succeeded: the whole batch on
//     success, nothing on a function error or a failed invoke, and with
//     ReportBatchItemFailures all but the batchItemFailures (an answer naming an unknown id
//     fails the whole batch). What is not deleted comes back after the visibility timeout, so
//     the redrive policy applies.
//   - AWS::Scheduler::ScheduleGroup. kumo stores schedules but never fires them, so the runner
//     does, twice a second: an enabled one-time at(...) schedule (in its time zone) that is due,
//     whose target is an event bus, has the target's Input put on that bus as the detail of an
//     event with the target's EventBridgeParameters source and detail type, as Scheduler does;
//     with ActionAfterCompletion DELETE it is then deleted. A failed put is retried the next
//     round. rate() and cron() schedules and other targets are not fired (with a warning).
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
// per process; its API Gateway, EventBridge and Step Functions invoke Lambda (EventBridge its
// SQS targets too) by calling the emulator at a hard-coded http://localhost:4566, so the stack
// sends its process's connections to that address to its own listener, and a stack on another
// address runs its own functions, even beside another stack on 4566; EventBridge rule
// schedules never fire; rules with Step Functions targets are not delivered; PutEvents
// matches rules only when EventBusName is the bus name (AWS also takes its ARN), and it gives
// every event a new id and the current time; Scheduler's ListSchedules ignores its group
// filter (the firer lists every group anyway). The package is for Unix hosts (process groups).
package stack
