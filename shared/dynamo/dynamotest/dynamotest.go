// Package dynamotest runs the store's tables on an in-process emulator (kumo) for tests.
package dynamotest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/table"
)

// Env is a fresh pair of tables on an emulator and a store on them.
type Env struct {
	Client *dynamodb.Client
	Store  *dynamo.Store
	Calls  *Calls
	// URL is the emulator's endpoint, for other services' clients (count them with
	// Calls.Middleware).
	URL string
}

var envSeq atomic.Int64

// New starts an emulator (closed when the test ends), creates the tables as shared/table
// defines them, and returns a store whose SDK calls are counted.
func New(t testing.TB) *Env {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	calls := &Calls{}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		APIOptions:   []func(*middleware.Stack) error{calls.Middleware},
	})
	env := fmt.Sprintf("test%d", envSeq.Add(1))
	ctx := context.Background()
	for _, tb := range []table.Table{table.State, table.Audit} {
		if err := CreateTable(ctx, client, tb, tb.Name(env)); err != nil {
			t.Fatal(err)
		}
	}
	return &Env{Client: client, Store: dynamo.New(client, table.State.Name(env), table.Audit.Name(env)), Calls: calls, URL: srv.URL}
}

// CreateTable creates a table as defined, with on-demand billing.
func CreateTable(ctx context.Context, client *dynamodb.Client, tb table.Table, name string) error {
	str := types.ScalarAttributeTypeS
	attrs := []types.AttributeDefinition{
		{AttributeName: aws.String(table.PartitionKey), AttributeType: str},
		{AttributeName: aws.String(table.SortKey), AttributeType: str},
	}
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(name),
		BillingMode: types.BillingModePayPerRequest,
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(table.PartitionKey), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(table.SortKey), KeyType: types.KeyTypeRange},
		},
	}
	for _, ix := range tb.Indexes {
		attrs = append(attrs,
			types.AttributeDefinition{AttributeName: aws.String(ix.PartitionKey), AttributeType: str},
			types.AttributeDefinition{AttributeName: aws.String(ix.SortKey), AttributeType: str})
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName: aws.String(ix.Name),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(ix.PartitionKey), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(ix.SortKey), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		})
	}
	in.AttributeDefinitions = attrs
	if _, err := client.CreateTable(ctx, in); err != nil {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	if tb.TTL {
		_, err := client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
			TableName:               aws.String(name),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(table.TTLAttribute), Enabled: aws.Bool(true)},
		})
		if err != nil {
			return fmt.Errorf("enable TTL on %s: %w", name, err)
		}
	}
	return nil
}

// Calls counts SDK operations by name.
type Calls struct {
	counts sync.Map // operation name -> *atomic.Int64
}

// Middleware counts the calls of any SDK client it is added to (Options.APIOptions).
func (c *Calls) Middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("CountCalls",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			n, _ := c.counts.LoadOrStore(awsmiddleware.GetOperationName(ctx), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

// Snapshot returns the counts so far.
func (c *Calls) Snapshot() map[string]int64 {
	out := map[string]int64{}
	c.counts.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// Items returns every item of a table, for before/after comparisons.
func (e *Env) Items(t testing.TB, tableName string) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	p := dynamodb.NewScanPaginator(e.Client, &dynamodb.ScanInput{TableName: aws.String(tableName), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", tableName, err)
		}
		items = append(items, out.Items...)
	}
	return items
}

// Reset forgets the counts.
func (c *Calls) Reset() { c.counts.Clear() }
