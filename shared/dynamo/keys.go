package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/capacity"
)

// Keys reads API keys from their own table (shared/table.Keys), apart from the state table
// that the functions write: the api function's role may only GetItem there, so no function
// can mint or change a key. It is auth's KeyStore.
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
	if k.Table == "" {
		return nil, fmt.Errorf("get API key: %w", errNoKeysTable)
	}
	out, err := k.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(k.Table),
		Key:       itemKey(apiKeyPK(hash), skAPIKey),
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

// Put provisions keys, each created only if absent (an existing key is never overwritten).
// This is the operator's and the local stack's path; no function's role may call it.
func (k *Keys) Put(ctx context.Context, keys ...capacity.APIKey) error {
	if err := k.check(keys); err != nil {
		return err
	}
	items := make([]any, 0, len(keys))
	for _, key := range keys {
		items = append(items, newAPIKeyItem(key))
	}
	return putNew(ctx, k.Client, k.Table, items)
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
