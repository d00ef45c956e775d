package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/table"
)

// FuzzAPICursor sends any cursor (and limit) to every list route. It asserts properties, not
// how cursors are made: the answer is never a 5xx, a refused cursor is a 4xx, and no query
// reaches DynamoDB with a start key DynamoDB would refuse (a ValidationException, answered
// 500 on AWS, where the emulator may answer 200): every ExclusiveStartKey holds exactly the
// key attributes of the table or index queried, as non-empty strings, in the partition the
// query reads.
func FuzzAPICursor(f *testing.F) {
	keys := &startKeys{}
	a := newFuzzAPI(f, dynamotest.WithAPIOptions(keys.middleware))
	var lists []uint8
	for i, r := range routes.All {
		if r.Method == "GET" && strings.HasPrefix(r.OperationID, "list") {
			lists = append(lists, uint8(i))
		}
	}
	// Seeds: the cursors the lists hand out (pages of one) and made-up ones; the node's
	// partition without a sort key once reached DynamoDB as a start key on the audit lists.
	cursor := func(m map[string]string) string {
		b, _ := json.Marshal(m)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	made := []string{"", "x", "====", cursor(map[string]string{"pk": "NODE#" + demo.NodeID, "sk": "AUDIT#9"}),
		cursor(map[string]string{"pk": "NODE#" + demo.NodeID}),
		cursor(map[string]string{"pk": "NODE#other", "sk": "x"}),
		cursor(map[string]string{"pk": "", "sk": ""}), cursor(map[string]string{"gsi2pk": "x", "gsi2sk": "y", "pk": "p", "sk": "s"}),
		strings.Repeat("A", 5000)}
	for _, i := range lists {
		r := routes.All[i]
		resp, err := a.adapter.ProxyWithContext(context.Background(), events.APIGatewayProxyRequest{HTTPMethod: r.Method,
			Path: fuzzPath(r, ""), Headers: map[string]string{"Authorization": "Bearer " + demo.OperatorSecret},
			MultiValueQueryStringParameters: map[string][]string{"limit": {"1"}}})
		if err != nil {
			f.Fatal(err)
		}
		var page struct {
			NextCursor string `json:"nextCursor"`
		}
		_ = json.Unmarshal([]byte(resp.Body), &page)
		for _, c := range append(made, page.NextCursor) {
			f.Add(i, uint8(0), c, "1")
		}
	}
	f.Fuzz(func(t *testing.T, route, secret uint8, cursor, limit string) {
		i := lists[int(route)%len(lists)]
		keys.reset()
		c := fuzzCall{route: i, secret: secret, rawQuery: cursor, queryFromCursor: true, limit: limit}
		a.do(t, c)
		if bad := keys.reset(); len(bad) > 0 {
			t.Fatalf("cursor %q on %s: queried with a start key DynamoDB would refuse: %v", cursor, routes.All[i].OperationID, bad)
		}
	})
}

// startKeys checks the ExclusiveStartKey of every Query and Scan the function sends.
type startKeys struct {
	mu  sync.Mutex
	bad []string
}

func (s *startKeys) reset() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	bad := s.bad
	s.bad = nil
	return bad
}

func (s *startKeys) middleware(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("fuzzStartKeys",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			var esk map[string]types.AttributeValue
			var index *string
			var values map[string]types.AttributeValue
			switch p := in.Parameters.(type) {
			case *dynamodb.QueryInput:
				esk, index, values = p.ExclusiveStartKey, p.IndexName, p.ExpressionAttributeValues
			case *dynamodb.ScanInput:
				esk, index = p.ExclusiveStartKey, p.IndexName
			}
			if esk != nil {
				if why := badStartKey(esk, index, values); why != "" {
					s.mu.Lock()
					s.bad = append(s.bad, why)
					s.mu.Unlock()
				}
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}

// badStartKey says what is wrong with a start key, "" if nothing: its attributes must be the
// table's keys (pk, sk) and the index's, each a non-empty string, and for a query its partition
// must be one the query names.
func badStartKey(esk map[string]types.AttributeValue, index *string, values map[string]types.AttributeValue) string {
	want := []string{table.PartitionKey, table.SortKey}
	partition := table.PartitionKey
	if index != nil {
		ix, ok := findIndex(*index)
		if !ok {
			return fmt.Sprintf("unknown index %q", *index)
		}
		want = append(want, ix.PartitionKey)
		if ix.SortKey != "" {
			want = append(want, ix.SortKey)
		}
		partition = ix.PartitionKey
	}
	var got []string
	for name, v := range esk {
		got = append(got, name)
		if s, ok := v.(*types.AttributeValueMemberS); !ok || s.Value == "" {
			return fmt.Sprintf("attribute %q is %T, not a non-empty string", name, v)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(slices.Compact(want), got) {
		return fmt.Sprintf("attributes %v, want %v", got, want)
	}
	if values != nil {
		p := esk[partition].(*types.AttributeValueMemberS).Value
		if !slices.ContainsFunc(slices.Collect(maps.Values(values)), func(v types.AttributeValue) bool {
			s, ok := v.(*types.AttributeValueMemberS)
			return ok && s.Value == p
		}) {
			return fmt.Sprintf("partition %q is not the one queried", p)
		}
	}
	return ""
}

func findIndex(name string) (table.Index, bool) {
	for _, tb := range table.All {
		for _, ix := range tb.Indexes {
			if ix.Name == name {
				return ix, true
			}
		}
	}
	return table.Index{}, false
}
