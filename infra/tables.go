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
	props.TableClass = tableClass(spec)
	// The state table takes every reclaim's writes: warm it (and its indexes) for a burst,
	// where the environment says so. The other tables take a record or a check a call, well
	// within a new table's 4,000 writes a second.
	warm := s.warmThroughput(spec)
	props.WarmThroughput = warm
	t := awsdynamodb.NewTable(s.Stack, jsii.String(spec.LogicalID), props)
	for _, ix := range spec.Indexes {
		t.AddGlobalSecondaryIndex(&awsdynamodb.GlobalSecondaryIndexProps{
			IndexName:      jsii.String(ix.Name),
			PartitionKey:   str(ix.PartitionKey),
			SortKey:        str(ix.SortKey),
			ProjectionType: projection(ix),
			WarmThroughput: warm,
		})
	}
	return t
}

// projection is the index's: its keys only where shared/table says so, every attribute otherwise.
func projection(ix table.Index) awsdynamodb.ProjectionType {
	if ix.KeysOnly {
		return awsdynamodb.ProjectionType_KEYS_ONLY
	}
	return awsdynamodb.ProjectionType_ALL
}

// warmThroughput is the table's warm throughput: the environment's for the state table, nil
// (DynamoDB's default) otherwise or when it sets none.
func (s *CapacityStack) warmThroughput(spec table.Table) *awsdynamodb.WarmThroughput {
	if spec.LogicalID != table.State.LogicalID || (s.warm.write == 0 && s.warm.read == 0) {
		return nil
	}
	w := &awsdynamodb.WarmThroughput{}
	if s.warm.write > 0 {
		w.WriteUnitsPerSecond = jsii.Number(s.warm.write)
	}
	if s.warm.read > 0 {
		w.ReadUnitsPerSecond = jsii.Number(s.warm.read)
	}
	return w
}

// infrequentAccess are the tables whose cost is their storage: the audit table keeps every
// record for good (a reclaim's is about 770 B; its byReservation entry holds its keys only) and
// is read only when someone asks for a trail. Standard-IA stores at 40% of Standard's price
// and reads and writes at 125%: for a reclaim (3 write units, no read, the record kept) about
// $2.40 a million less (docs/cost.md), more every month the records stay. Latency,
// durability and PITR are the same in both classes.
var infrequentAccess = map[string]bool{table.Audit.LogicalID: true}

// tableClass is the table's class: Standard-IA for those of infrequentAccess.
func tableClass(spec table.Table) awsdynamodb.TableClass {
	if infrequentAccess[spec.LogicalID] {
		return awsdynamodb.TableClass_STANDARD_INFREQUENT_ACCESS
	}
	return awsdynamodb.TableClass_STANDARD
}
