package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// cfnTable holds the properties of AWS::DynamoDB::Table and the ones AWS::DynamoDB::GlobalTable
// (CDK's TableV2) shares with it; replicas are meaningless locally.
type cfnTable struct {
	TableName              string
	KeySchema              []cfnKey
	AttributeDefinitions   []cfnAttribute
	BillingMode            string
	ProvisionedThroughput  *cfnThroughput
	GlobalSecondaryIndexes []cfnIndex
	LocalSecondaryIndexes  []cfnIndex
	StreamSpecification    *struct {
		StreamViewType string
	}
	TimeToLiveSpecification *struct {
		AttributeName string
		Enabled       cfnBool
	}
}

type cfnKey struct{ AttributeName, KeyType string }

type cfnAttribute struct{ AttributeName, AttributeType string }

type cfnThroughput struct{ ReadCapacityUnits, WriteCapacityUnits cfnInt }

type cfnIndex struct {
	IndexName  string
	KeySchema  []cfnKey
	Projection struct {
		ProjectionType   string
		NonKeyAttributes []string
	}
	ProvisionedThroughput *cfnThroughput
}

func provisionTable(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var t cfnTable
	if err := decodeProps(props, &t); err != nil {
		return nil, err
	}

	name := valueOr(t.TableName, generatedName(p.stackName, id, 255))

	// CloudFormation's default billing mode is PROVISIONED (and GlobalTable requires one).
	provisioned := t.BillingMode != string(types.BillingModePayPerRequest)

	in := &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		KeySchema:            keySchema(t.KeySchema),
		AttributeDefinitions: make([]types.AttributeDefinition, len(t.AttributeDefinitions)),
		BillingMode:          types.BillingModePayPerRequest,
	}

	for i, a := range t.AttributeDefinitions {
		in.AttributeDefinitions[i] = types.AttributeDefinition{
			AttributeName: aws.String(a.AttributeName),
			AttributeType: types.ScalarAttributeType(a.AttributeType),
		}
	}

	if provisioned {
		in.BillingMode = types.BillingModeProvisioned
		in.ProvisionedThroughput = throughput(t.ProvisionedThroughput)
	}

	for _, ix := range t.GlobalSecondaryIndexes {
		gsi := types.GlobalSecondaryIndex{
			IndexName:  aws.String(ix.IndexName),
			KeySchema:  keySchema(ix.KeySchema),
			Projection: projection(ix),
		}
		if provisioned {
			gsi.ProvisionedThroughput = throughput(ix.ProvisionedThroughput)
		}

		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, gsi)
	}

	for _, ix := range t.LocalSecondaryIndexes {
		in.LocalSecondaryIndexes = append(in.LocalSecondaryIndexes, types.LocalSecondaryIndex{
			IndexName:  aws.String(ix.IndexName),
			KeySchema:  keySchema(ix.KeySchema),
			Projection: projection(ix),
		})
	}

	if t.StreamSpecification != nil && t.StreamSpecification.StreamViewType != "" {
		in.StreamSpecification = &types.StreamSpecification{
			StreamEnabled:  aws.Bool(true),
			StreamViewType: types.StreamViewType(t.StreamSpecification.StreamViewType),
		}
	}

	p.quotaRes.Tables = append(p.quotaRes.Tables, quotaTable(name, provisioned, t))

	out, err := p.dynamodb.CreateTable(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("create table %s: %w", name, err)
	}

	if ttl := t.TimeToLiveSpecification; ttl != nil && bool(ttl.Enabled) {
		_, err := p.dynamodb.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
			TableName: aws.String(name),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{
				AttributeName: aws.String(ttl.AttributeName),
				Enabled:       aws.Bool(true),
			},
		})
		if err != nil {
			return nil, fmt.Errorf("enable TTL on table %s: %w", name, err)
		}
	}

	attrs := map[string]any{"Arn": fmt.Sprintf("arn:%s:dynamodb:%s:%s:table/%s", partition, region, accountID, name)}

	if d := out.TableDescription; d != nil {
		if d.TableArn != nil {
			attrs["Arn"] = *d.TableArn
		}

		if d.LatestStreamArn != nil {
			attrs["StreamArn"] = *d.LatestStreamArn
		}
	}

	p.log.Info("created table", "table", name, "indexes", len(t.GlobalSecondaryIndexes))

	return &physical{ref: name, attrs: attrs}, nil
}

func keySchema(keys []cfnKey) []types.KeySchemaElement {
	out := make([]types.KeySchemaElement, len(keys))
	for i, k := range keys {
		out[i] = types.KeySchemaElement{AttributeName: aws.String(k.AttributeName), KeyType: types.KeyType(k.KeyType)}
	}

	return out
}

func projection(ix cfnIndex) *types.Projection {
	typ := ix.Projection.ProjectionType
	if typ == "" {
		typ = string(types.ProjectionTypeAll)
	}

	return &types.Projection{ProjectionType: types.ProjectionType(typ), NonKeyAttributes: ix.Projection.NonKeyAttributes}
}

// throughput defaults to 5/5, CDK's default for provisioned tables.
func throughput(t *cfnThroughput) *types.ProvisionedThroughput {
	read, write := int64(5), int64(5)

	if t != nil {
		if t.ReadCapacityUnits > 0 {
			read = int64(t.ReadCapacityUnits)
		}

		if t.WriteCapacityUnits > 0 {
			write = int64(t.WriteCapacityUnits)
		}
	}

	return &types.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(read), WriteCapacityUnits: aws.Int64(write)}
}

// quotaTable is what the quota model needs of a table: the keys of its partitions and its
// indexes'.
func quotaTable(name string, provisioned bool, t cfnTable) quota.Table {
	hash := func(keys []cfnKey) string {
		for _, k := range keys {
			if k.KeyType == "HASH" {
				return k.AttributeName
			}
		}
		return ""
	}
	qt := quota.Table{Name: name, PartitionKey: hash(t.KeySchema), Provisioned: provisioned}
	for _, ix := range t.GlobalSecondaryIndexes {
		qt.Indexes = append(qt.Indexes, quota.Index{Name: ix.IndexName, PartitionKey: hash(ix.KeySchema),
			KeysOnly: ix.Projection.ProjectionType == "KEYS_ONLY"})
	}
	return qt
}
