package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/table"
)

// stackTables are the tables the stack creates, each built from its shared/table description.
var stackTables = table.All

// newTables creates every table of stackTables (s.Tables).
func (s *CapacityStack) newTables() {
	for _, spec := range stackTables {
		s.Tables[spec.LogicalID] = s.newTable(spec)
	}
}

// table is the stack's table of spec.
func (s *CapacityStack) table(spec table.Table) awsdynamodb.Table {
	return s.Tables[spec.LogicalID]
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
