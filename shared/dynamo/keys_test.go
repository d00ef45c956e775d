package dynamo_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

func hashOf(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

var (
	tFar        = t0.AddDate(1, 0, 0)
	operatorKey = capacity.APIKey{KeyID: "key-op", Hash: hashOf(capacity.FixedKeySecret("op")), OrgID: "platform", Operator: true,
		Permissions: []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}, ExpiresAt: &tFar}
	revokedKey = capacity.APIKey{KeyID: "key-rev", Hash: hashOf(capacity.FixedKeySecret("rev")), OrgID: "owner", Revoked: true,
		Permissions: []string{capacity.PermCapacity}}
)

// pks returns the partition keys of a table's items.
func pks(t *testing.T, env *dynamotest.Env, tableName string) []string {
	t.Helper()
	var out []string
	for _, it := range env.Items(t, tableName) {
		out = append(out, it["pk"].(*types.AttributeValueMemberS).Value)
	}
	return out
}

// API keys are seeded into the keys table only, and looked up there: the state table, which
// the functions may write, holds no key.
func TestKeysLiveInTheirOwnTable(t *testing.T) {
	s := seed(2, 1)
	s.Keys = []capacity.APIKey{operatorKey, revokedKey}
	env := newEnv(t, s)

	for _, pk := range pks(t, env, env.Store.Table) {
		if !strings.HasPrefix(pk, "NODE#") {
			t.Errorf("state table holds an item outside a node partition: %s", pk)
		}
	}
	var keyItems, pointers int
	for _, pk := range pks(t, env, env.Store.KeysTable) {
		switch {
		case strings.HasPrefix(pk, "APIKEY#"):
			keyItems++
		case strings.HasPrefix(pk, "KEYID#"):
			pointers++
		default:
			t.Errorf("keys table holds %s", pk)
		}
	}
	if keyItems != 2 || pointers != 2 {
		t.Errorf("keys table holds %d keys and %d id pointers, want the 2 seeded keys and theirs", keyItems, pointers)
	}

	keys := env.Store.Keys()
	for _, tt := range []struct {
		name string
		hash string
		want *capacity.APIKey
	}{
		{"operator key", operatorKey.Hash, &operatorKey},
		{"revoked key is returned as revoked", revokedKey.Hash, &revokedKey},
		{"unknown hash", hashOf(capacity.FixedKeySecret("unknown")), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for name, lookup := range map[string]func(context.Context, string) (*capacity.APIKey, error){
				"LookupKey": keys.LookupKey, "LookupKeyConsistent": keys.LookupKeyConsistent,
			} {
				got, err := lookup(context.Background(), tt.hash)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("%s = %+v, want %+v", name, got, tt.want)
				}
			}
		})
	}
}

// A compromised function may put any item into the state table (its role allows PutItem
// there). A key item it writes there must not authenticate anyone.
func TestKeyForgedInStateTableIsNotFound(t *testing.T) {
	env := newEnv(t, seed(1, 0))
	forged := operatorKey
	forged.Hash = hashOf(capacity.FixedKeySecret("forged"))
	item, err := attributevalue.MarshalMap(forged)
	if err != nil {
		t.Fatal(err)
	}
	// The key layout, as the keys table stores it.
	item["pk"] = &types.AttributeValueMemberS{Value: "APIKEY#" + forged.Hash}
	item["sk"] = &types.AttributeValueMemberS{Value: "APIKEY"}
	item["type"] = &types.AttributeValueMemberS{Value: "apikey"}
	if _, err := env.Client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(env.Store.Table), Item: item}); err != nil {
		t.Fatal(err)
	}
	got, err := env.Store.Keys().LookupKey(context.Background(), forged.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if got != nil {
		t.Fatalf("a key written to the state table was found: %+v", got)
	}
}

// Provisioning never overwrites a key: re-seeding a revoked key as valid fails and leaves it
// revoked.
func TestPutKeyNeverOverwrites(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: []capacity.APIKey{revokedKey}})
	unrevoked := revokedKey
	unrevoked.Revoked = false
	err := env.Store.Keys().Put(context.Background(), unrevoked)
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		t.Fatalf("Put over an existing key: err = %v, want ConditionalCheckFailed", err)
	}
	got, err := env.Store.Keys().LookupKey(context.Background(), revokedKey.Hash)
	if err != nil || got == nil || !got.Revoked {
		t.Fatalf("after the refused Put: %+v, %v; want the key still revoked", got, err)
	}
}

// A Put repeated after a lost answer completes: an existing item identical to the one to put
// counts as put, so the key's id pointer is written even when the key item landed first.
func TestPutKeyRetried(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		faults []awsfault.Rule
		before func(t *testing.T, env *dynamotest.Env) // what the earlier attempt left
	}{
		{"the same keys again", nil, func(t *testing.T, env *dynamotest.Env) {
			if err := env.Store.Keys().Put(ctx, operatorKey); err != nil {
				t.Fatal(err)
			}
		}},
		{"the key landed, its pointer did not", nil, func(t *testing.T, env *dynamotest.Env) {
			if err := env.Store.Keys().Put(ctx, operatorKey); err != nil {
				t.Fatal(err)
			}
			_, err := env.Plain.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(env.Store.KeysTable),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "KEYID#" + operatorKey.KeyID},
					"sk": &types.AttributeValueMemberS{Value: "KEYID"}}})
			if err != nil {
				t.Fatal(err)
			}
		}},
		// Every answer lost: each write lands, the SDK's retry meets its item.
		{"every answer lost", []awsfault.Rule{{Operation: "PutItem", Fault: awsfault.AmbiguousTimeout, Rate: 1}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := awsfault.New(1, tt.faults...)
			env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
			if tt.before != nil {
				tt.before(t, env)
			}
			if err := env.Store.Keys().Put(ctx, operatorKey, revokedKey); err != nil {
				t.Fatalf("Put: %v (faults %v)", err, inj.Counts())
			}
			if len(tt.faults) > 0 && inj.Count(awsfault.AmbiguousTimeout) == 0 {
				t.Error("no answer was lost")
			}
			if n := countPrefix(t, env, "KEYID#"); n != 2 {
				t.Errorf("%d id pointers, want 2", n)
			}
			for _, k := range []capacity.APIKey{operatorKey, revokedKey} {
				if got, err := env.Store.GetKey(ctx, k.KeyID); err != nil || got.Hash != k.Hash {
					t.Errorf("GetKey(%s) = %+v, %v", k.KeyID, got, err)
				}
			}
		})
	}
}

func withKeys(s dynamo.Seed, keys ...capacity.APIKey) dynamo.Seed {
	s.Keys = append(s.Keys, keys...)
	return s
}

func TestKeysRefusesBadInput(t *testing.T) {
	env := dynamotest.New(t)
	noTable := dynamo.New(env.Client, env.Store.Table, env.Store.AuditTable) // KeysTable unset
	badHash := operatorKey
	badHash.Hash = strings.ToUpper(operatorKey.Hash) // lookups hash to lower-case hex: never found
	for _, tt := range []struct {
		name string
		call func() error
		want string
	}{
		{"lookup without a keys table", func() error {
			_, err := noTable.Keys().LookupKey(context.Background(), operatorKey.Hash)
			return err
		}, "no API keys table"},
		{"seed keys without a keys table", func() error {
			return noTable.Put(context.Background(), withKeys(seed(1, 0), operatorKey))
		}, "no API keys table"},
		{"seed with a bad key", func() error {
			return env.Store.Put(context.Background(), withKeys(seed(1, 0), operatorKey, badHash))
		}, "SHA-256"},
		{"key whose hash is not a SHA-256", func() error {
			return env.Store.Keys().Put(context.Background(), badHash)
		}, "SHA-256"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	// Nothing was written: bad keys are refused before the state items are.
	for _, name := range []string{env.Store.Table, env.Store.KeysTable} {
		if n := len(env.Items(t, name)); n != 0 {
			t.Errorf("%s has %d items after refused calls, want 0", name, n)
		}
	}
}

// A key lookup DynamoDB keeps throttling past the SDK's retries is "throttled" (503, retry
// later), not an internal error: under load every call authenticates first.
func TestThrottledKeyLookupIsThrottled(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "GetItem", Fault: awsfault.Throttling, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	_, err := env.Store.Keys().LookupKey(context.Background(), hashOf(capacity.FixedKeySecret("op")))
	if capacity.ErrorCode(err) != capacity.CodeThrottled {
		t.Fatalf("lookup: %v (code %s), want throttled", err, capacity.ErrorCode(err))
	}
}
