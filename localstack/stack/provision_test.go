package stack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestSkippedType: what the local stack leaves out on purpose (and so does not warn about),
// and what it does not.
func TestSkippedType(t *testing.T) {
	for typ, want := range map[string]bool{
		"AWS::IAM::Role": true, "AWS::IAM::Policy": true, "AWS::Lambda::Permission": true, "AWS::Logs::LogGroup": true,
		"AWS::CDK::Metadata": true, "AWS::ApiGateway::Account": true,
		"AWS::SNS::Topic": true, "AWS::SNS::Subscription": true, "AWS::SNS::TopicPolicy": true,
		"AWS::KMS::Key": false, "AWS::KMS::Alias": true, "AWS::CloudWatch::Alarm": true, "AWS::CloudWatch::Dashboard": true,
		"AWS::DynamoDB::Table": false, "AWS::Lambda::Function": false, "AWS::SQS::Queue": false,
	} {
		if got := skippedType(typ); got != want {
			t.Errorf("skippedType(%s) = %v, want %v", typ, got, want)
		}
	}
}

// TestProvisionQueuesMappingsAndScheduleGroups provisions what the event path needs, as CDK
// synthesises it, on the emulator: a queue with a dead-letter queue and SSE, its policy, an
// event source mapping the runner must poll, and a schedule group.
func TestProvisionQueuesMappingsAndScheduleGroups(t *testing.T) {
	cfg := kumoServer(t)
	stackName := uniqueName("prov")

	tmpl, err := parseTemplate([]byte(`{"Resources": {
		"Dlq": {"Type": "AWS::SQS::Queue", "Properties": {"MessageRetentionPeriod": 1209600, "SqsManagedSseEnabled": true}},
		"Queue": {"Type": "AWS::SQS::Queue", "Properties": {
			"VisibilityTimeout": 180, "KmsMasterKeyId": "alias/aws/sqs",
			"RedrivePolicy": {"deadLetterTargetArn": {"Fn::GetAtt": ["Dlq", "Arn"]}, "maxReceiveCount": 5}}},
		"QueuePolicy": {"Type": "AWS::SQS::QueuePolicy", "Properties": {
			"Queues": [{"Ref": "Queue"}],
			"PolicyDocument": {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "sqs:*",
				"Resource": {"Fn::GetAtt": ["Queue", "Arn"]}, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}}},
		"Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Handler": "bootstrap", "Runtime": "provided.al2023", "Role": "arn:aws:iam::000000000000:role/r"}},
		"Mapping": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {
			"FunctionName": {"Ref": "Fn"}, "EventSourceArn": {"Fn::GetAtt": ["Queue", "Arn"]},
			"BatchSize": 10, "FunctionResponseTypes": ["ReportBatchItemFailures"]}},
		"Group": {"Type": "AWS::Scheduler::ScheduleGroup", "Properties": {"Name": "` + stackName + `-group"}}
	}, "Outputs": {"QueueUrl": {"Value": {"Ref": "Queue"}}, "GroupArn": {"Value": {"Fn::GetAtt": ["Group", "Arn"]}}}}`))
	if err != nil {
		t.Fatal(err)
	}

	p := newProvisioner(tmpl, stackName, *cfg.BaseEndpoint, discardLogger())
	if err := p.run(t.Context()); err != nil {
		t.Fatal(err)
	}

	queueURL := p.res.resources["Queue"].ref
	dlqARN := p.res.resources["Dlq"].attrs["Arn"]

	if len(p.mappings) != 1 || !p.schedules {
		t.Fatalf("mappings %+v, schedules %v", p.mappings, p.schedules)
	}

	want := mappingSpec{
		uuid: p.mappings[0].uuid, function: stackName + "-Fn", queueARN: p.res.resources["Queue"].attrs["Arn"].(string),
		queueURL: queueURL, batchSize: 10, reportFailures: true,
	}
	if p.mappings[0] != want || want.uuid == "" {
		t.Errorf("mapping = %+v, want %+v", p.mappings[0], want)
	}

	attrs, err := p.sqs.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: []sqstypes.QueueAttributeName{"All"}})
	if err != nil {
		t.Fatal(err)
	}

	if a := attrs.Attributes; a["VisibilityTimeout"] != "180" || a["RedrivePolicy"] != fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":5}`, dlqARN) ||
		!strings.Contains(a["Policy"], "aws:SecureTransport") {
		t.Errorf("queue attributes = %v", a)
	}

	esm, err := p.lambda.GetEventSourceMapping(t.Context(), &lambda.GetEventSourceMappingInput{UUID: aws.String(want.uuid)})
	if err != nil || aws.ToString(esm.EventSourceArn) != want.queueARN || aws.ToInt32(esm.BatchSize) != 10 {
		t.Errorf("mapping in the emulator: %+v, %v", esm, err)
	}

	group, err := p.scheduler.GetScheduleGroup(t.Context(), &scheduler.GetScheduleGroupInput{Name: aws.String(stackName + "-group")})
	if err != nil || p.res.resources["Group"].attrs["Arn"] != aws.ToString(group.Arn) {
		t.Errorf("schedule group: %+v, %v", group, err)
	}
}
