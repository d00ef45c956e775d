// Package dynamotest runs the store's tables, and the termination workflow's starter, on an
// in-process emulator (kumo) for tests.
package dynamotest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/table"
)

// Env is a fresh set of tables (state, audit, keys) on an emulator and a store on them.
type Env struct {
	Client *dynamodb.Client // the store's client, with any Option applied
	// Plain is a client on the same tables without the Options' middleware (no injected
	// faults), for setup and checks.
	Plain *dynamodb.Client
	Store *dynamo.Store
	Calls *Calls
	// URL is the emulator's endpoint, for other services' clients (count them with
	// Calls.Middleware).
	URL string
}

var envSeq atomic.Int64

// Option changes the store's client.
type Option func(*dynamodb.Options)

// WithAPIOptions adds middleware (for example an awsfault injector's APIOption) to the
// store's client. Tables are created before it applies: setup never meets injected faults.
func WithAPIOptions(fns ...func(*middleware.Stack) error) Option {
	return func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, fns...) }
}

// New starts an emulator (closed when the test ends), creates the tables as shared/table
// defines them, and returns a store whose SDK calls are counted. The client retries as the
// functions' clients do (shared/config: standard retryer, SDKMaxAttempts, which a test
// there checks this client has; a test kit may not import it), with millisecond
// backoff so that tests under injected throttling stay fast.
func New(t testing.TB, opts ...Option) *Env {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	calls := &Calls{}
	o := dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.MaxBackoff = 5 * time.Millisecond
		}),
	}
	env := fmt.Sprintf("test%d", envSeq.Add(1))
	o.APIOptions = []func(*middleware.Stack) error{calls.Middleware, keysOnlyIndexes(env)}
	setup := dynamodb.New(o)
	ctx := context.Background()
	for _, tb := range table.All {
		if err := CreateTable(ctx, setup, tb, tb.Name(env)); err != nil {
			t.Fatal(err)
		}
	}
	for _, opt := range opts {
		opt(&o)
	}
	client := dynamodb.New(o)
	store := dynamo.New(client, table.State.Name(env), table.Audit.Name(env))
	store.KeysTable = table.Keys.Name(env)
	store.LimitsTable = table.Limits.Name(env)
	return &Env{Client: client, Plain: setup, Store: store, Calls: calls, URL: srv.URL}
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
	defined := map[string]bool{table.PartitionKey: true, table.SortKey: true}
	for _, ix := range tb.Indexes {
		// An index may key on the table's own sort key: each attribute is defined once.
		for _, name := range []string{ix.PartitionKey, ix.SortKey} {
			if !defined[name] {
				defined[name] = true
				attrs = append(attrs, types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: str})
			}
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName: aws.String(ix.Name),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(ix.PartitionKey), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(ix.SortKey), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: projection(ix)},
		})
	}
	in.AttributeDefinitions = attrs
	if _, err := client.CreateTable(ctx, in); err != nil {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	// TTL is left off: the tests run on fixed clocks (t0 in the past), and the emulator's reaper
	// deletes every 30 s, by the real clock, each item whose TTL has passed, so an item written
	// with a TTL a day after t0 would vanish at a random moment of a test. Tests read the TTL
	// attribute the store writes instead. (The local stack enables TTL as the template says.)
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

// StateItems returns every item of the state table without the audit chains' heads (the node
// items' AuditSeq and AuditHead, and the pin of the chain's start set with the first record;
// and the items heading the nodes' calls chains), which audited calls advance: for
// comparisons of what a call that should change nothing but the audit trail changed.
func (e *Env) StateItems(t testing.TB) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	for _, it := range e.Items(t, e.Store.Table) {
		if sk, ok := it["sk"].(*types.AttributeValueMemberS); ok && sk.Value == "AUDITHEAD#CALLS" {
			continue
		}
		for _, a := range []string{"AuditSeq", "AuditHead", "AuditStartCount", "AuditStartDigest"} {
			delete(it, a)
		}
		items = append(items, it)
	}
	return items
}

// Items returns every item of a table, for before/after comparisons.
func (e *Env) Items(t testing.TB, tableName string) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	p := dynamodb.NewScanPaginator(e.Plain, &dynamodb.ScanInput{TableName: aws.String(tableName), ConsistentRead: aws.Bool(true)})
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

// Clean is a store on the Env's tables whose client has none of the Options (no injected
// faults), for setup and checks.
func (e *Env) Clean() *dynamo.Store {
	s := dynamo.New(e.Plain, e.Store.Table, e.Store.AuditTable)
	s.KeysTable, s.LimitsTable = e.Store.KeysTable, e.Store.LimitsTable
	return s
}

// Faults is the option that makes the store meet inj's faults; none for a nil inj.
func Faults(inj *awsfault.Injector) []Option {
	if inj == nil {
		return nil
	}
	return []Option{WithAPIOptions(inj.APIOption)}
}

func projection(ix table.Index) types.ProjectionType {
	if ix.KeysOnly {
		return types.ProjectionTypeKeysOnly
	}
	return types.ProjectionTypeAll
}

// keysOnlyIndexes makes a Query of a KEYS_ONLY index answer as AWS does, with the table's
// keys and the index's only: kumo ignores an index's projection and answers whole items.
// Query is the only read of an index.
func keysOnlyIndexes(env string) func(*middleware.Stack) error {
	keys := map[string]map[string][]string{} // table name -> index -> its attributes
	for _, tb := range table.All {
		for _, ix := range tb.Indexes {
			if ix.KeysOnly {
				if keys[tb.Name(env)] == nil {
					keys[tb.Name(env)] = map[string][]string{}
				}
				keys[tb.Name(env)][ix.Name] = []string{table.PartitionKey, table.SortKey, ix.PartitionKey, ix.SortKey}
			}
		}
	}
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("KeysOnlyIndexes",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				q, ok := in.Parameters.(*dynamodb.QueryInput)
				if err != nil || !ok || q.IndexName == nil {
					return out, md, err
				}
				attrs, ok := keys[aws.ToString(q.TableName)][aws.ToString(q.IndexName)]
				if !ok {
					return out, md, err
				}
				res := out.Result.(*dynamodb.QueryOutput)
				for i, it := range res.Items {
					kept := map[string]types.AttributeValue{}
					for _, a := range attrs {
						if v, ok := it[a]; ok {
							kept[a] = v
						}
					}
					res.Items[i] = kept
				}
				return out, md, err
			}), middleware.After)
	}
}

// Snapshot is what a refused call must leave as it was: the state table as StateItems gives
// it, and the keys table without the keys' LastUsedAt (an authenticated call records its
// use), each item in a canonical form, sorted.
type Snapshot []string

// Snapshot reads the state and keys tables (for fuzz targets' before/after comparisons).
func (e *Env) Snapshot(t testing.TB) Snapshot {
	t.Helper()
	items := e.StateItems(t)
	if e.Store.KeysTable != "" {
		for _, it := range e.Items(t, e.Store.KeysTable) {
			delete(it, "LastUsedAt")
			items = append(items, it)
		}
	}
	out := make(Snapshot, 0, len(items))
	for _, it := range items {
		var m map[string]any
		if err := attributevalue.UnmarshalMap(it, &m); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		b, err := json.Marshal(m) // map keys sorted: one form per item
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// Diff describes the items of s not in o and of o not in s ("" when none).
func (s Snapshot) Diff(o Snapshot) string {
	var b strings.Builder
	for _, it := range s {
		if !slices.Contains(o, it) {
			fmt.Fprintf(&b, "- %s\n", it)
		}
	}
	for _, it := range o {
		if !slices.Contains(s, it) {
			fmt.Fprintf(&b, "+ %s\n", it)
		}
	}
	return b.String()
}
