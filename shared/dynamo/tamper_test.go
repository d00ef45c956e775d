package dynamo_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// verifyAll verifies a chain as capacityctl audit verify does: every page, against the head
// of the last page, then the head read once more if records stand past it.
func verifyAll(t *testing.T, list func(capacity.PageRequest) (*capacity.AuditChainPage, error)) ([]capacity.AuditRecord, capacity.ChainReport) {
	t.Helper()
	var recs []capacity.AuditRecord
	var head capacity.AuditHead
	page := capacity.PageRequest{Limit: 3}
	for {
		p, err := list(page)
		if err != nil {
			t.Fatalf("list audit: %v", err)
		}
		head, recs = p.Head, append(recs, p.Records...)
		if p.NextCursor == "" {
			break
		}
		page.Cursor = p.NextCursor
	}
	rep := capacity.VerifyAuditChain(head, recs)
	if rep.OK && rep.Past > 0 {
		again, err := list(capacity.PageRequest{Limit: 1})
		if err != nil {
			t.Fatalf("read the head again: %v", err)
		}
		rep = capacity.ConfirmHead(rep, again.Head)
	}
	return recs, rep
}

// Each way of tampering with the tables that audit verify used to pass now fails it, on the
// store as the service writes it: a node's head moved back, an unchained record planted
// before the chain, a key's grants changed in place (and a key un-revoked).
func TestVerifyCatchesTampering(t *testing.T) {
	ctx := context.Background()
	owner := capacity.Principal{KeyID: "k-owner", OrgID: "owner", Permissions: []string{capacity.PermCapacity, capacity.PermRead}}
	tests := []struct {
		name    string
		tamper  func(t *testing.T, env *dynamotest.Env, key capacity.APIKey)
		node    string // the problem of n1's changes chain ("" = OK)
		keyProb string // the problem verify --keys reports about the key ("" = OK; "chain <problem>": of the key chain)
		calls   string // the problem of n1's calls chain ("" = OK)
	}{
		{"untouched", func(*testing.T, *dynamotest.Env, capacity.APIKey) {}, "", "", ""},
		{"node head rolled back", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			rec := getItem(t, env, env.Store.AuditTable, "NODE#n1", "SEQ#00000000000000000002")
			update(t, env, env.Store.Table, "NODE#n1", "NODE", "SET AuditSeq = :s, AuditHead = :h", map[string]types.AttributeValue{
				":s": &types.AttributeValueMemberN{Value: "2"}, ":h": rec["hash"]})
		}, capacity.ChainBeyondHead, "", ""},
		{"back-dated unchained record planted", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			item, err := attributevalue.MarshalMap(map[string]any{"pk": "NODE#n1", "sk": "2020-01-01T00:00:00Z#planted", "type": "audit",
				"ID": "planted", "Time": time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), "NodeID": "n1", "Action": capacity.ActionReclaim,
				"Outcome": "ok", "Reason": "approved by ops"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.AuditTable), Item: item}); err != nil {
				t.Fatal(err)
			}
		}, capacity.ChainInserted, "", ""},
		{"key chain's head loses its start pin", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			update(t, env, env.Store.KeysTable, "APIKEYS", "AUDITHEAD", "SET AuditStartDigest = :d", map[string]types.AttributeValue{
				":d": &types.AttributeValueMemberS{Value: ""}})
		}, "", "chain " + capacity.ChainRemoved, ""},
		{"key made operator in place", func(t *testing.T, env *dynamotest.Env, k capacity.APIKey) {
			update(t, env, env.Store.KeysTable, "APIKEY#"+k.Hash, "APIKEY", "SET Operator = :t",
				map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}})
		}, "", capacity.ChainAltered, ""},
		{"key given a permission in place", func(t *testing.T, env *dynamotest.Env, k capacity.APIKey) {
			update(t, env, env.Store.KeysTable, "APIKEY#"+k.Hash, "APIKEY", "SET #p = :p", map[string]types.AttributeValue{
				":p": &types.AttributeValueMemberL{Value: []types.AttributeValue{
					&types.AttributeValueMemberS{Value: capacity.PermCapacity}, &types.AttributeValueMemberS{Value: capacity.PermRead}}}},
				"#p", "Permissions")
		}, "", capacity.ChainAltered, ""},
		{"key's expiry removed in place", func(t *testing.T, env *dynamotest.Env, k capacity.APIKey) {
			update(t, env, env.Store.KeysTable, "APIKEY#"+k.Hash, "APIKEY", "SET ExpiresAt = :n",
				map[string]types.AttributeValue{":n": &types.AttributeValueMemberNULL{Value: true}})
		}, "", capacity.ChainAltered, ""},
		{"calls head rolled back", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			rec := getItem(t, env, env.Store.AuditTable, "NODE#n1#CALLS", "SEQ#00000000000000000002")
			update(t, env, env.Store.Table, "NODE#n1", "AUDITHEAD#CALLS", "SET AuditSeq = :s, AuditHead = :h", map[string]types.AttributeValue{
				":s": &types.AttributeValueMemberN{Value: "2"}, ":h": rec["hash"]})
		}, "", "", capacity.ChainBeyondHead},
		{"unchained record planted before the calls chain", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			item, err := attributevalue.MarshalMap(map[string]any{"pk": "NODE#n1#CALLS", "sk": "2020-01-01T00:00:00Z#planted", "type": "audit",
				"ID": "planted", "Time": time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), "NodeID": "n1", "Action": capacity.ActionReclaim,
				"Outcome": "ok", "DryRun": true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.AuditTable), Item: item}); err != nil {
				t.Fatal(err)
			}
		}, "", "", capacity.ChainInserted},
		{"calls head loses its start pin", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			update(t, env, env.Store.Table, "NODE#n1", "AUDITHEAD#CALLS", "REMOVE AuditStartDigest, AuditStartCount", nil)
		}, "", "", capacity.ChainRemoved},
		{"a calls record altered", func(t *testing.T, env *dynamotest.Env, _ capacity.APIKey) {
			update(t, env, env.Store.AuditTable, "NODE#n1#CALLS", "SEQ#00000000000000000003", "SET Outcome = :o",
				map[string]types.AttributeValue{":o": &types.AttributeValueMemberS{Value: "invalid_request"}})
		}, "", "", capacity.ChainAltered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := seed(4, 3) // u0..u2 released: each reclaim below changes the node
			s.Keys = []capacity.APIKey{operatorKey}
			env := newEnv(t, s)
			svc := &capacity.Service{Store: env.Store, Keys: env.Store, Now: func() time.Time { return t0.Add(time.Hour) },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			// Four dry runs on the calls chain, three reclaims on the changes chain.
			for i := range 7 {
				if _, err := svc.Reclaim(ctx, owner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{fmt.Sprintf("u%d", i%3)}, DryRun: i < 4},
					capacity.RequestMeta{}); err != nil {
					t.Fatal(err)
				}
			}
			exp := t0.Add(48 * time.Hour)
			res, err := svc.CreateKey(ctx, opPrincipal, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, ExpiresAt: &exp},
				capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			tt.tamper(t, env, res.Key)

			records := map[capacity.NodeChain]int{capacity.ChainChanges: 3, capacity.ChainCalls: 4}
			for chain, want := range map[capacity.NodeChain]string{capacity.ChainChanges: tt.node, capacity.ChainCalls: tt.calls} {
				if _, rep := verifyAll(t, func(p capacity.PageRequest) (*capacity.AuditChainPage, error) {
					return svc.ListNodeAudit(ctx, opPrincipal, "n1", chain, p)
				}); rep.Problem != want || rep.OK != (want == "") || want == "" && (!rep.Pinned || rep.Checked != records[chain]) {
					t.Errorf("node chain %s: %+v, want problem %q on a pinned chain", chain, rep, want)
				}
			}
			recs, rep := verifyAll(t, func(p capacity.PageRequest) (*capacity.AuditChainPage, error) {
				return svc.ListKeyAudit(ctx, opPrincipal, p)
			})
			if want, ok := strings.CutPrefix(tt.keyProb, "chain "); ok {
				if rep.OK || rep.Problem != want {
					t.Errorf("key chain: %+v, want problem %s", rep, want)
				}
				return
			}
			if !rep.OK || !rep.Pinned || rep.Checked != 1 {
				t.Fatalf("key chain: %+v", rep)
			}
			keys, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{})
			if err != nil {
				t.Fatal(err)
			}
			kr := capacity.VerifyKeyGrants(recs, keys.Keys)
			if kr.Problem != tt.keyProb || kr.OK != (tt.keyProb == "") {
				t.Errorf("keys: %+v, want problem %q", kr, tt.keyProb)
			}
			if kr.OK && (kr.Checked != 1 || len(kr.Unrecorded) != 1 || kr.Unrecorded[0] != operatorKey.KeyID) {
				t.Errorf("keys: %+v, want the new key checked and the seeded one reported unrecorded", kr)
			}
		})
	}
}

func getItem(t *testing.T, env *dynamotest.Env, tableName, pk, sk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := env.Plain.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(tableName), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: sk}}})
	if err != nil || out.Item == nil {
		t.Fatalf("get %s/%s: %v", pk, sk, err)
	}
	return out.Item
}

// update changes an item behind the service's back (names: "#x", "Name" pairs).
func update(t *testing.T, env *dynamotest.Env, tableName, pk, sk, expr string, values map[string]types.AttributeValue, names ...string) {
	t.Helper()
	in := &dynamodb.UpdateItemInput{TableName: aws.String(tableName), UpdateExpression: aws.String(expr), ExpressionAttributeValues: values,
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: sk}}}
	if len(names) > 0 {
		in.ExpressionAttributeNames = map[string]string{}
		for i := 0; i+1 < len(names); i += 2 {
			in.ExpressionAttributeNames[names[i]] = names[i+1]
		}
	}
	if _, err := env.Plain.UpdateItem(context.Background(), in); err != nil {
		t.Fatalf("update %s/%s: %v", pk, sk, err)
	}
}
