package dynamo

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Keys looks API keys up in their own table (shared/table.Keys), apart from the state table
// that the other functions write: of the functions only the api function may reach it, to
// look keys up, record their last use and (through Store's KeyStore methods below) manage
// keys for operators. It is auth's KeyStore and Toucher; Put seeds keys outside the functions.
type Keys struct {
	Client *dynamodb.Client
	Table  string
}

// errNoKeysTable: without it a lookup would be a ValidationException from DynamoDB, and a
// seed would silently have nowhere to go.
var errNoKeysTable = errors.New("no API keys table configured")

// LookupKey returns the API key stored under the SHA-256 hash of its secret, or nil. One
// GetItem, eventually consistent: a new key may take a moment to work, and auth caches
// lookups for longer than that anyway.
func (k *Keys) LookupKey(ctx context.Context, hash string) (*capacity.APIKey, error) {
	return k.lookupKey(ctx, hash, false)
}

// LookupKeyConsistent is LookupKey with a strongly consistent read: a key revoked a moment
// ago is seen revoked (auth reads the caller's key so before a call that grants).
func (k *Keys) LookupKeyConsistent(ctx context.Context, hash string) (*capacity.APIKey, error) {
	return k.lookupKey(ctx, hash, true)
}

func (k *Keys) lookupKey(ctx context.Context, hash string, consistent bool) (*capacity.APIKey, error) {
	if k.Table == "" {
		return nil, fmt.Errorf("get API key: %w", errNoKeysTable)
	}
	out, err := k.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(k.Table),
		Key:            itemKey(apiKeyPK(hash), skAPIKey),
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return nil, fmt.Errorf("get API key: %w", classify(err))
	}
	if out.Item == nil {
		return nil, nil
	}
	var it apiKeyItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode API key: %w", err)
	}
	key := it.apiKey()
	return &key, nil
}

// Put provisions keys (the local stack's seed; the first operator key goes through the
// domain, capacityctl keys create --bootstrap), each with its id pointer. Every item is created
// only if absent, so an existing key is never overwritten; an existing item identical to the
// one to put counts as put, so a Put retried after a lost answer completes the pointer. No
// function's role may call it.
func (k *Keys) Put(ctx context.Context, keys ...capacity.APIKey) error {
	if err := k.check(keys); err != nil {
		return err
	}
	for _, key := range keys {
		// The key first: an existing, different one is refused before its pointer is touched.
		for _, v := range []any{newAPIKeyItem(key), newKeyIDItem(key)} {
			if err := k.putOrSame(ctx, v); err != nil {
				return fmt.Errorf("put API key %s: %w", key.KeyID, err)
			}
		}
	}
	return nil
}

// putOrSame puts the item if its key is free. When it is taken, one consistent read tells
// whether by this very item (success: an earlier attempt landed) or by another (the failed
// condition is returned).
func (k *Keys) putOrSame(ctx context.Context, v any) error {
	item, err := attributevalue.MarshalMap(v)
	if err != nil {
		return fmt.Errorf("encode item: %w", err)
	}
	cond, err := expression.NewBuilder().WithCondition(expression.Name(attrPK).AttributeNotExists()).Build()
	if err != nil {
		return fmt.Errorf("build condition: %w", err)
	}
	_, err = k.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(k.Table), Item: item,
		ConditionExpression: cond.Condition(), ExpressionAttributeNames: cond.Names(),
	})
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		if err != nil {
			return fmt.Errorf("put %s: %w", attr(item, attrPK), classify(err))
		}
		return nil
	}
	out, gerr := k.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(k.Table), Key: itemKey(attr(item, attrPK), attr(item, attrSK)), ConsistentRead: aws.Bool(true),
	})
	if gerr != nil {
		return fmt.Errorf("put %s: %w (and reading it: %w)", attr(item, attrPK), err, classify(gerr))
	}
	if sameItem(out.Item, item) {
		return nil
	}
	return fmt.Errorf("put %s: another item is stored there: %w", attr(item, attrPK), err)
}

// sameItem compares two items by their decoded values (numbers as numbers).
func sameItem(a, b map[string]types.AttributeValue) bool {
	var da, db map[string]any
	if a == nil || attributevalue.UnmarshalMap(a, &da) != nil || attributevalue.UnmarshalMap(b, &db) != nil {
		return false
	}
	return reflect.DeepEqual(da, db)
}

// check refuses keys that could never be looked up, or nowhere to put them.
func (k *Keys) check(keys []capacity.APIKey) error {
	if k.Table == "" {
		return fmt.Errorf("put API keys: %w", errNoKeysTable)
	}
	for _, key := range keys {
		if len(key.Hash) != 64 || strings.Trim(key.Hash, "0123456789abcdef") != "" {
			return fmt.Errorf("put API key %q: want the lower-case hex SHA-256 of its secret as Hash", key.KeyID)
		}
	}
	return nil
}

const (
	typeKeyID    = "apikeyid"
	skKeyID      = "KEYID"
	skKeyIdem    = "IDEM"
	attrRevoked  = "Revoked"
	attrRevAt    = "RevokedAt"
	attrLastUsed = "LastUsedAt"

	// touchEvery: LastUsedAt moves at most this often, whichever instance asks.
	touchEvery = time.Minute
)

func keyIDPK(keyID string) string { return "KEYID#" + keyID }

func keyIdemPK(scope string) string { return "KEYIDEM#" + scope }

// keyIDItem points from a key's id to the hash its item is stored under.
type keyIDItem struct {
	PK    string `dynamodbav:"pk"`
	SK    string `dynamodbav:"sk"`
	Type  string `dynamodbav:"type"`
	KeyID string `dynamodbav:"KeyID"`
	Hash  string `dynamodbav:"Hash"`
}

func newKeyIDItem(k capacity.APIKey) keyIDItem {
	return keyIDItem{PK: keyIDPK(k.KeyID), SK: skKeyID, Type: typeKeyID, KeyID: k.KeyID, Hash: k.Hash}
}

// TouchKey records that the key was used at `at`: one UpdateItem, conditioned so that
// LastUsedAt moves at most once a minute across every instance. A failed condition means
// someone recorded it within the minute (or the key is gone): success.
func (k *Keys) TouchKey(ctx context.Context, hash string, at time.Time) error {
	if k.Table == "" {
		return fmt.Errorf("touch API key: %w", errNoKeysTable)
	}
	now := at.Unix()
	cond := expression.Name(attrPK).AttributeExists().And(expression.Or(
		expression.Name(attrLastUsed).AttributeNotExists(),
		expression.Name(attrLastUsed).LessThanEqual(expression.Value(now-int64(touchEvery/time.Second)))))
	expr, err := expression.NewBuilder().WithCondition(cond).
		WithUpdate(expression.Set(expression.Name(attrLastUsed), expression.Value(now))).Build()
	if err != nil {
		return fmt.Errorf("touch API key: build update: %w", err)
	}
	_, err = k.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(k.Table), Key: itemKey(apiKeyPK(hash), skAPIKey),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("touch API key: %w", classify(err))
	}
	return nil
}

var _ capacity.KeyStore = (*Store)(nil)

func (s *Store) keysTable() error {
	if s.KeysTable == "" {
		return errNoKeysTable
	}
	return nil
}

// KeyIdempotency returns the record of a key creation made under the scope (or its legacy
// scope), or nil: consistent GetItems.
func (s *Store) KeyIdempotency(ctx context.Context, scope string) (*capacity.IdempotencyRecord, error) {
	if err := s.keysTable(); err != nil {
		return nil, fmt.Errorf("read key idempotency record: %w", err)
	}
	// As for the node's records: one written before scopes named the calling key still binds.
	return readScoped(ctx, scope, func(scope string) (*capacity.IdempotencyRecord, error) {
		out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(s.KeysTable), Key: itemKey(keyIdemPK(scope), skKeyIdem), ConsistentRead: aws.Bool(true),
		})
		if err != nil {
			return nil, fmt.Errorf("read key idempotency record: %w", classify(err))
		}
		if out.Item == nil {
			return nil, nil
		}
		var it idempotencyItem
		if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
			return nil, fmt.Errorf("decode key idempotency record: %w", err)
		}
		rec := it.record()
		return &rec, nil
	})
}

// CreateKey puts the key, its id pointer, its idempotency record (if any) and its audit
// record on the keys chain in one transaction, each new item conditioned on its absence (the
// idempotency record may replace an expired one). ErrConflict when one exists.
func (s *Store) CreateKey(ctx context.Context, key capacity.APIKey, idem *capacity.IdempotencyRecord, audit capacity.AuditRecord) error {
	if err := s.keysTable(); err != nil {
		return fmt.Errorf("create API key: %w", err)
	}
	if err := (&Keys{Table: s.KeysTable}).check([]capacity.APIKey{key}); err != nil {
		return err
	}
	var others []types.TransactWriteItem
	for _, v := range []any{newAPIKeyItem(key), newKeyIDItem(key)} {
		it, err := s.putNew(s.KeysTable, v, nil)
		if err != nil {
			return fmt.Errorf("create API key %s: %w", key.KeyID, err)
		}
		others = append(others, it)
	}
	if idem != nil {
		it := newIdempotencyItem(*idem)
		it.PK, it.SK = keyIdemPK(idem.Scope), skKeyIdem
		// A record past its expiry may still be there; it no longer binds the key.
		expired := expression.Name(attrExpiresAt).LessThanEqual(expression.Value(idem.CreatedAt.Unix()))
		put, err := s.putNew(s.KeysTable, it, &expired)
		if err != nil {
			return fmt.Errorf("create API key %s: idempotency record: %w", key.KeyID, err)
		}
		others = append(others, put)
	}
	return s.appendChained(ctx, "create API key "+key.KeyID, audit, s.keysHead(), others, refuseOwn(len(others)))
}

// refuseOwn turns a cancellation that failed on one of the first n items (the call's own,
// ahead of the audit items) into ErrConflict; a failure on the audit items is left to
// appendChained (the head moved).
func refuseOwn(n int) func(*types.TransactionCanceledException) error {
	return func(e *types.TransactionCanceledException) error {
		for i, r := range e.CancellationReasons {
			if i < n && aws.ToString(r.Code) == "ConditionalCheckFailed" {
				return fmt.Errorf("item %d: %w", i, capacity.ErrConflict)
			}
		}
		return nil
	}
}

// GetKey returns the key with the id (consistent reads of its id pointer and the key), or
// an *Error CodeNotFound. Keys provisioned before id pointers existed are found by a Scan.
func (s *Store) GetKey(ctx context.Context, keyID string) (*capacity.APIKey, error) {
	return s.keyByID(ctx, keyID, true)
}

// KeyByID is GetKey by GetItem alone: a key without an id pointer is not found. The firing
// of a scheduled reclaim reads its creator's key through it, with read-only GetItem on the
// keys table and no Scan.
func (s *Store) KeyByID(ctx context.Context, keyID string) (*capacity.APIKey, error) {
	return s.keyByID(ctx, keyID, false)
}

func (s *Store) keyByID(ctx context.Context, keyID string, scanLegacy bool) (*capacity.APIKey, error) {
	if err := s.keysTable(); err != nil {
		return nil, fmt.Errorf("get API key %s: %w", keyID, err)
	}
	hash, err := s.keyHash(ctx, keyID, scanLegacy)
	if err != nil {
		return nil, err
	}
	if hash == "" {
		return nil, capacity.Errorf(capacity.CodeNotFound, "API key not found")
	}
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.KeysTable), Key: itemKey(apiKeyPK(hash), skAPIKey), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("get API key %s: %w", keyID, classify(err))
	}
	if out.Item == nil {
		return nil, capacity.Errorf(capacity.CodeNotFound, "API key not found")
	}
	var it apiKeyItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return nil, fmt.Errorf("decode API key %s: %w", keyID, err)
	}
	key := it.apiKey()
	return &key, nil
}

// keyHash returns the hash the key with the id is stored under ("" if none): its id pointer
// (a consistent GetItem), or, with scanLegacy, for a key provisioned before pointers existed,
// a Scan.
func (s *Store) keyHash(ctx context.Context, keyID string, scanLegacy bool) (string, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.KeysTable), Key: itemKey(keyIDPK(keyID), skKeyID), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return "", fmt.Errorf("get API key %s: %w", keyID, classify(err))
	}
	if out.Item != nil || !scanLegacy {
		return attr(out.Item, "Hash"), nil
	}
	return s.legacyKeyHash(ctx, keyID)
}

// legacyKeyHash finds the hash of a key without an id pointer ("" if none).
func (s *Store) legacyKeyHash(ctx context.Context, keyID string) (string, error) {
	expr, err := expression.NewBuilder().WithFilter(expression.Name(attrType).Equal(expression.Value(typeAPIKey)).
		And(expression.Name("KeyID").Equal(expression.Value(keyID)))).
		WithProjection(expression.NamesList(expression.Name("Hash"))).Build()
	if err != nil {
		return "", fmt.Errorf("find API key %s: build scan: %w", keyID, err)
	}
	p := dynamodb.NewScanPaginator(s.Client, &dynamodb.ScanInput{
		TableName: aws.String(s.KeysTable), ConsistentRead: aws.Bool(true), FilterExpression: expr.Filter(),
		ProjectionExpression: expr.Projection(), ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return "", fmt.Errorf("find API key %s: %w", keyID, classify(err))
		}
		if len(page.Items) > 0 {
			return attr(page.Items[0], "Hash"), nil
		}
	}
	return "", nil
}

// maxKeyScanPages bounds the Scan pages one ListKeys reads to fill its page: past it the
// page is answered short, with a cursor.
const maxKeyScanPages = 10

// ListKeys returns up to limit keys in the table's (hash) order after the key afterKeyID: a
// consistent Scan filtered on the key items, started after that key's item (found by its id
// pointer: the hash never leaves the store), read on until the page is full and one more key
// is seen, or the table ends, or maxKeyScanPages were read with at least one key to answer
// (a short page; more is then true).
func (s *Store) ListKeys(ctx context.Context, limit int, afterKeyID string) ([]capacity.APIKey, bool, error) {
	if err := s.keysTable(); err != nil {
		return nil, false, fmt.Errorf("list API keys: %w", err)
	}
	var start map[string]types.AttributeValue
	if afterKeyID != "" {
		hash, err := s.keyHash(ctx, afterKeyID, true)
		if err != nil {
			return nil, false, err
		}
		if hash == "" {
			return nil, false, capacity.Errorf(capacity.CodeInvalidRequest, "invalid cursor")
		}
		start = itemKey(apiKeyPK(hash), skAPIKey)
	}
	expr, err := expression.NewBuilder().WithFilter(expression.Name(attrType).Equal(expression.Value(typeAPIKey))).Build()
	if err != nil {
		return nil, false, fmt.Errorf("list API keys: build scan: %w", err)
	}
	keys := []capacity.APIKey{}
	for pages := 1; ; pages++ {
		out, err := s.Client.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(s.KeysTable), ConsistentRead: aws.Bool(true), Limit: aws.Int32(int32(limit + 1 - len(keys))),
			ExclusiveStartKey: start, FilterExpression: expr.Filter(),
			ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		})
		if err != nil {
			return nil, false, fmt.Errorf("list API keys: %w", classify(err))
		}
		for _, item := range out.Items {
			if len(keys) == limit {
				return keys, true, nil
			}
			var it apiKeyItem
			if err := attributevalue.UnmarshalMap(item, &it); err != nil {
				return nil, false, fmt.Errorf("decode API key %s: %w", attr(item, attrPK), err)
			}
			keys = append(keys, it.apiKey())
		}
		start = out.LastEvaluatedKey
		if len(start) == 0 {
			return keys, false, nil
		}
		if pages >= maxKeyScanPages && len(keys) > 0 {
			return keys, true, nil
		}
	}
}

// RevokeKey marks the key revoked, conditioned on it existing unrevoked, and appends the
// audit record on the keys chain, in one transaction. ErrConflict when it was revoked since.
func (s *Store) RevokeKey(ctx context.Context, key capacity.APIKey, at time.Time, audit capacity.AuditRecord) error {
	if err := s.keysTable(); err != nil {
		return fmt.Errorf("revoke API key %s: %w", key.KeyID, err)
	}
	cond := expression.Name(attrPK).AttributeExists().And(expression.Or(
		expression.Name(attrRevoked).AttributeNotExists(), expression.Name(attrRevoked).Equal(expression.Value(false))))
	upd := expression.Set(expression.Name(attrRevoked), expression.Value(true)).
		Set(expression.Name(attrRevAt), expression.Value(at.UTC()))
	expr, err := expression.NewBuilder().WithCondition(cond).WithUpdate(upd).Build()
	if err != nil {
		return fmt.Errorf("revoke API key %s: build update: %w", key.KeyID, err)
	}
	it := types.TransactWriteItem{Update: &types.Update{
		TableName: aws.String(s.KeysTable), Key: itemKey(apiKeyPK(key.Hash), skAPIKey),
		ConditionExpression: expr.Condition(), UpdateExpression: expr.Update(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	}}
	return s.appendChained(ctx, "revoke API key "+key.KeyID, audit, s.keysHead(), []types.TransactWriteItem{it}, refuseOwn(1))
}
