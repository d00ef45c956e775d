package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/table"
)

// Secrets of the demo keys.
const (
	keyOperator = demo.OperatorSecret
	keyOwner    = demo.OwnerSecret
	keyManager  = demo.ManagerSecret
	keyAudience = demo.AudienceSecret
	keyReadOnly = demo.ReadOnlySecret
)

var (
	httpClient = &http.Client{Timeout: 30 * time.Second}
	nodeSeq    atomic.Int64
)

// newNode seeds a copy of the demo node under a fresh id, so tests do not share state, and
// returns its id. Reservation and VM ids are the demo's.
func newNode(t testing.TB, edit func(*dynamo.Seed)) string {
	t.Helper()
	id := fmt.Sprintf("node-e2e-%d-%d", time.Now().UnixNano()%1e6, nodeSeq.Add(1))
	w := demo.Seed(time.Now())
	w.Keys = nil
	w.Nodes[0].ID = id
	for i := range w.Reservations {
		w.Reservations[i].NodeID = id
	}
	for i := range w.VMs {
		w.VMs[i].NodeID = id
	}
	w.Nodes[0].AgentEndpoint = agents.Endpoint(id)
	if edit != nil {
		edit(&w)
	}
	if err := store.Put(context.Background(), w); err != nil {
		t.Fatalf("seed node %s: %v", id, err)
	}
	for _, vm := range w.VMs {
		if err := agents.AddVM(id, vm.ID, string(vm.State)); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// call sends a request through API Gateway. body may be a string (sent as is) or a value
// (sent as JSON); header pairs follow.
func call(t testing.TB, method, path, key string, body any, header ...string) response {
	t.Helper()
	var reqBody []byte
	switch b := body.(type) {
	case nil:
	case string:
		reqBody = []byte(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		reqBody = raw
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(apiURL, "/")+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := response{resp.StatusCode, resp.Header, raw}
	checkContract(t, method, path, req.Header, reqBody, out)
	return out
}

// unitIDs returns the unit ids of a node of n units: gpu-0 to gpu-<n-1>.
func unitIDs(n int) []string { return numbered("gpu", n) }

// numbered returns <prefix>-0 to <prefix>-<n-1>.
func numbered(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

func reclaimPath(node string) string {
	return "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaim"
}

func releasePath(node string) string {
	return "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/release"
}

// partition returns every item of a node's partition in the state table, as stored.
func partition(t testing.TB, node string) []map[string]types.AttributeValue {
	return nodeItems(t, store.Table, node)
}

// auditOf returns the audit records of a node: its changes chain's, then its calls chain's
// (dry runs, refusals, replays).
func auditOf(t testing.TB, node string) []map[string]types.AttributeValue {
	return append(nodeItems(t, store.AuditTable, node), partitionItems(t, store.AuditTable, "NODE#"+node+"#CALLS")...)
}

func nodeItems(t testing.TB, tableName, node string) []map[string]types.AttributeValue {
	return partitionItems(t, tableName, "NODE#"+node)
}

func partitionItems(t testing.TB, tableName, pk string) []map[string]types.AttributeValue {
	t.Helper()
	expr, err := expression.NewBuilder().WithKeyCondition(
		expression.Key(table.PartitionKey).Equal(expression.Value(pk))).Build()
	if err != nil {
		t.Fatal(err)
	}
	out, err := client.Query(context.Background(), &dynamodb.QueryInput{
		TableName: aws.String(tableName), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	if err != nil {
		t.Fatalf("query %s for %s: %v", tableName, pk, err)
	}
	return out.Items
}

// assertUnchanged fails unless the node's partition holds what it held before, apart from the
// head of its calls chain: a call that changes nothing still appends its audit record (a dry
// run, a refusal) to that chain, whose head is an item of its own in the partition.
func assertUnchanged(t testing.TB, node string, before []map[string]types.AttributeValue) {
	t.Helper()
	if after := partition(t, node); !reflect.DeepEqual(withoutAuditHead(before), withoutAuditHead(after)) {
		t.Fatalf("node %s partition changed", node)
	}
}

func withoutAuditHead(items []map[string]types.AttributeValue) []map[string]types.AttributeValue {
	out := make([]map[string]types.AttributeValue, 0, len(items))
	for _, it := range items {
		if sk, ok := it["sk"].(*types.AttributeValueMemberS); ok && sk.Value == "AUDITHEAD#CALLS" {
			continue
		}
		c := maps.Clone(it)
		for _, a := range []string{"AuditSeq", "AuditHead", "AuditStartCount", "AuditStartDigest"} {
			delete(c, a)
		}
		out = append(out, c)
	}
	return out
}

func loadNode(t testing.TB, node string) *capacity.NodeState {
	t.Helper()
	st, err := store.LoadNode(context.Background(), node, "")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
