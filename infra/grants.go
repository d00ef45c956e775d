package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsstepfunctions"
	"github.com/aws/jsii-runtime-go"
)

// allow grants fn exactly these actions on the table itself (not on its indexes), as one
// explicit statement with id sid. Never use grantReadWriteData & co: they add Scan, DeleteItem,
// BatchWriteItem...
func allow(fn awslambda.Function, sid string, t awsdynamodb.ITable, actions ...string) {
	allowOn(fn, sid, t.TableArn(), actions...)
}

// allowIndex grants fn these actions on one index of the table only (table/<name>/index/<index>).
func allowIndex(fn awslambda.Function, sid string, t awsdynamodb.ITable, index string, actions ...string) {
	allowOn(fn, sid, awscdk.Fn_Join(jsii.String(""), &[]*string{t.TableArn(), jsii.String("/index/" + index)}), actions...)
}

// allowStateMachine grants fn these actions on the state machine (not on its executions).
func allowStateMachine(fn awslambda.Function, sid string, sm awsstepfunctions.IStateMachine, actions ...string) {
	allowOn(fn, sid, sm.StateMachineArn(), actions...)
}

func allowOn(fn awslambda.Function, sid string, resource *string, actions ...string) {
	fn.AddToRolePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String(sid),
		Effect:    awsiam.Effect_ALLOW,
		Actions:   jsii.Strings(actions...),
		Resources: &[]*string{resource},
	}))
}
