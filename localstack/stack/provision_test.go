package stack

import "testing"

// TestSkippedType: what the local stack leaves out on purpose (and so does not warn about),
// and what it does not.
func TestSkippedType(t *testing.T) {
	for typ, want := range map[string]bool{
		"AWS::IAM::Role": true, "AWS::IAM::Policy": true, "AWS::Lambda::Permission": true, "AWS::Logs::LogGroup": true,
		"AWS::CDK::Metadata": true, "AWS::ApiGateway::Account": true,
		"AWS::SNS::Topic": true, "AWS::SNS::Subscription": true, "AWS::SNS::TopicPolicy": true,
		"AWS::KMS::Key": true, "AWS::KMS::Alias": true, "AWS::CloudWatch::Alarm": true, "AWS::CloudWatch::Dashboard": true,
		"AWS::DynamoDB::Table": false, "AWS::Lambda::Function": false, "AWS::SQS::Queue": false,
	} {
		if got := skippedType(typ); got != want {
			t.Errorf("skippedType(%s) = %v, want %v", typ, got, want)
		}
	}
}
