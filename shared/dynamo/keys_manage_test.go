package dynamo_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

var opPrincipal = capacity.Principal{KeyID: "key-op", OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}

// keyService runs key management on the env's store at a fixed time.
func keyService(env *dynamotest.Env, now time.Time) *capacity.Service {
	return &capacity.Service{Store: env.Store, Keys: env.Store, Now: func() time.Time { return now }}
}

// keyAudits returns the records of the keys chain, in chain order.
func keyAudits(t *testing.T, env *dynamotest.Env) []map[string]types.AttributeValue {
	t.Helper()
	var out []map[string]types.AttributeValue
	for _, it := range env.Items(t, env.Store.AuditTable) {
		if it["pk"].(*types.AttributeValueMemberS).Value == "APIKEYS" {
			out = append(out, it)
		}
	}
	slices.SortFunc(out, func(a, b map[string]types.AttributeValue) int {
		return strings.Compare(a["sk"].(*types.AttributeValueMemberS).Value, b["sk"].(*types.AttributeValueMemberS).Value)
	})
	return out
}

func countPrefix(t *testing.T, env *dynamotest.Env, prefix string) int {
	t.Helper()
	n := 0
	for _, pk := range pks(t, env, env.Store.KeysTable) {
		if strings.HasPrefix(pk, prefix) {
			n++
		}
	}
	return n
}

func TestKeyLifecycle(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}})
	ctx := context.Background()
	svc := keyService(env, t0)
	exp := t0.Add(48 * time.Hour)
	res, err := svc.CreateKey(ctx, opPrincipal, capacity.KeyRequest{OrgID: "org-1",
		Permissions: []string{capacity.PermRead}, ExpiresAt: &exp, Description: "ci", IdempotencyKey: "i1"},
		capacity.RequestMeta{RequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	// auth finds it by the hash of its secret, with every attribute.
	got, err := env.Store.Keys().LookupKey(ctx, capacity.HashKeySecret(res.Secret))
	if err != nil || got == nil {
		t.Fatalf("lookup of the new key: %+v, %v", got, err)
	}
	want := res.Key
	if got.KeyID != want.KeyID || got.Description != "ci" || !got.CreatedAt.Equal(t0) || got.CreatedByKeyID != "key-op" ||
		!got.ExpiresAt.Equal(exp) || got.Revoked || got.RevokedAt != nil || got.LastUsedAt != nil {
		t.Errorf("stored key %+v, want %+v", got, want)
	}
	// The secret is nowhere in the tables.
	for _, name := range []string{env.Store.KeysTable, env.Store.AuditTable} {
		for _, it := range env.Items(t, name) {
			var m map[string]any
			_ = attributevalue.UnmarshalMap(it, &m)
			if strings.Contains(fmt.Sprint(m), res.Secret) {
				t.Errorf("%s holds the secret: %v", name, m)
			}
		}
	}
	// One chained audit record.
	audits := keyAudits(t, env)
	if len(audits) != 1 || attr(audits[0], "Action") != capacity.ActionKeyCreate || attr(audits[0], "sk") != fmt.Sprintf("SEQ#%020d", 1) ||
		attr(audits[0], "targetKeyId") != res.Key.KeyID || attr(audits[0], "Reason") != "" {
		t.Errorf("key audit records: %v", audits)
	}

	// Listed with the seeded key; pointers and records are not.
	page, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, k := range page.Keys {
		ids = append(ids, k.KeyID)
	}
	slices.Sort(ids)
	if want := slices.Sorted(slices.Values([]string{res.Key.KeyID, operatorKey.KeyID})); !slices.Equal(ids, want) || page.NextCursor != "" {
		t.Errorf("list = %v (next %q)", ids, page.NextCursor)
	}

	// Revoke, twice: one record, the key refused from then on.
	for range 2 {
		k, err := svc.RevokeKey(ctx, opPrincipal, capacity.KeyRevocation{KeyID: res.Key.KeyID, Reason: "rotated"}, capacity.RequestMeta{})
		if err != nil || !k.Revoked || !k.RevokedAt.Equal(t0) {
			t.Fatalf("revoke = %+v, %v", k, err)
		}
	}
	got, _ = env.Store.Keys().LookupKey(ctx, capacity.HashKeySecret(res.Secret))
	if !got.Revoked || got.RevokedAt == nil || !got.RevokedAt.Equal(t0) {
		t.Errorf("after revoke: %+v", got)
	}
	if audits := keyAudits(t, env); len(audits) != 2 || attr(audits[1], "Action") != capacity.ActionKeyRevoke ||
		attr(audits[1], "targetKeyId") != res.Key.KeyID || attr(audits[1], "Reason") != "rotated" {
		t.Errorf("key audit records after two revokes: %v", audits)
	}
	// The records read back as written: the chain verifies with the target key in the hash.
	chain, err := svc.ListKeyAudit(ctx, opPrincipal, capacity.PageRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rep := capacity.VerifyAuditChain(chain.Head, chain.Records); !rep.OK || rep.Checked != 2 ||
		chain.Records[1].TargetKeyID != res.Key.KeyID || chain.Records[1].Reason != "rotated" {
		t.Errorf("key chain %+v: %+v", chain.Records, rep)
	}
	// The seeded key (id pointer written by Put) and a key provisioned before pointers existed
	// are revoked by id too.
	legacy := capacity.APIKey{KeyID: "key-legacy", Hash: hashOf(capacity.FixedKeySecret("legacy")), OrgID: "org-2", Permissions: []string{capacity.PermRead}}
	item, _ := attributevalue.MarshalMap(map[string]any{"pk": "APIKEY#" + legacy.Hash, "sk": "APIKEY", "type": "apikey",
		"KeyID": legacy.KeyID, "Hash": legacy.Hash, "OrgID": legacy.OrgID, "Permissions": legacy.Permissions,
		"Operator": false, "Revoked": false, "ExpiresAt": nil})
	if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.KeysTable), Item: item}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"key-legacy", operatorKey.KeyID} {
		if k, err := svc.RevokeKey(ctx, opPrincipal, capacity.KeyRevocation{KeyID: id}, capacity.RequestMeta{}); err != nil || !k.Revoked {
			t.Errorf("revoke %s = %+v, %v", id, k, err)
		}
	}
	if _, err := svc.RevokeKey(ctx, opPrincipal, capacity.KeyRevocation{KeyID: "key-none"}, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeNotFound {
		t.Errorf("revoke of an unknown key: %v", err)
	}
}

// readerKeys are n keys of org o that may read: key-0, key-1...
func readerKeys(n int) []capacity.APIKey {
	var keys []capacity.APIKey
	for i := range n {
		keys = append(keys, capacity.APIKey{KeyID: fmt.Sprintf("key-%d", i), Hash: hashOf(fmt.Sprint(i)), OrgID: "o",
			Permissions: []string{capacity.PermRead}})
	}
	return keys
}

func TestListKeysPages(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: readerKeys(7)})
	svc := keyService(env, t0)
	ctx := context.Background()
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		page, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(page.Keys) > 3 {
			t.Fatalf("page of %d keys, limit 3", len(page.Keys))
		}
		for _, k := range page.Keys {
			if seen[k.KeyID] {
				t.Errorf("key %s listed twice", k.KeyID)
			}
			seen[k.KeyID] = true
		}
		if cursor = page.NextCursor; cursor == "" || pages > 10 {
			break
		}
	}
	if len(seen) != 7 {
		t.Errorf("listed %d keys over %d pages, want 7", len(seen), pages)
	}
	for _, bad := range []string{"garbage!", "e30", "eyJwayI6IngifQ"} { // not base64, {}, {"pk":"x"}
		_, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{Cursor: bad})
		if capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
			t.Errorf("cursor %q: %v, want invalid_request", bad, err)
		}
	}
	for _, limit := range []int{-1, 101} {
		if _, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{Limit: limit}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
			t.Errorf("limit %d: %v", limit, err)
		}
	}
}

// A create DynamoDB keeps throttling past the SDK's retries answers throttled and writes
// nothing.
func TestCreateKeyThrottled(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.Throttling, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	_, err := keyService(env, t0).CreateKey(context.Background(), opPrincipal,
		capacity.KeyRequest{OrgID: "o", Permissions: []string{capacity.PermRead}, IdempotencyKey: "i"}, capacity.RequestMeta{})
	if capacity.ErrorCode(err) != capacity.CodeThrottled {
		t.Fatalf("err = %v (code %s), want throttled", err, capacity.ErrorCode(err))
	}
	if inj.Count(awsfault.Throttling) == 0 {
		t.Fatal("no throttling injected")
	}
	for _, name := range []string{env.Store.KeysTable, env.Store.AuditTable} {
		if items := env.Items(t, name); len(items) != 0 {
			t.Errorf("%s holds %d items after a throttled create", name, len(items))
		}
	}
}

// The answer of a create that landed is lost: the call still answers the key with its
// secret, and a retry under the same Idempotency-Key answers the same key, without it.
func TestCreateKeyTimeoutAfterItLanded(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	svc := keyService(env, t0)
	req := capacity.KeyRequest{OrgID: "o", Permissions: []string{capacity.PermRead}, IdempotencyKey: "i"}
	res, err := svc.CreateKey(context.Background(), opPrincipal, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if inj.Count(awsfault.AmbiguousTimeout) == 0 {
		t.Fatal("no timeout injected")
	}
	got, err := env.Store.Keys().LookupKey(context.Background(), capacity.HashKeySecret(res.Secret))
	if err != nil || got == nil || got.KeyID != res.Key.KeyID {
		t.Fatalf("the answered secret does not find the stored key: %+v, %v", got, err)
	}
	again, err := svc.CreateKey(context.Background(), opPrincipal, req, capacity.RequestMeta{})
	if err != nil || again.Key.KeyID != res.Key.KeyID || again.Secret != "" || !again.SecretShown {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if n := countPrefix(t, env, "APIKEY#"); n != 1 {
		t.Errorf("%d keys stored, want 1", n)
	}
	outcome := func(it map[string]types.AttributeValue) string {
		return it["Outcome"].(*types.AttributeValueMemberS).Value
	}
	if recs := keyAudits(t, env); len(recs) != 2 || outcome(recs[0]) != "ok" || outcome(recs[1]) != capacity.OutcomeReplayed {
		t.Errorf("key audit records %+v, want the creation and the replay", recs)
	}
}

// lateKeys is the store as AWS may show it under a timeout: the first create lands but
// answers ambiguously, and the first read of the key does not see it yet.
type lateKeys struct {
	capacity.KeyStore
	mu              sync.Mutex
	creates, hidden int
}

func (l *lateKeys) CreateKey(ctx context.Context, k capacity.APIKey, idem *capacity.IdempotencyRecord, audit capacity.AuditRecord) error {
	err := l.KeyStore.CreateKey(ctx, k, idem, audit)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.creates++; l.creates == 1 && err == nil {
		return fmt.Errorf("create: %w", capacity.ErrAmbiguous)
	}
	return err
}

func (l *lateKeys) GetKey(ctx context.Context, keyID string) (*capacity.APIKey, error) {
	l.mu.Lock()
	hide := l.hidden > 0
	l.hidden--
	l.mu.Unlock()
	if hide {
		return nil, capacity.Errorf(capacity.CodeNotFound, "API key not found")
	}
	return l.KeyStore.GetKey(ctx, keyID)
}

// A create that landed but answered ambiguously, not seen by the read that checks: the next
// round puts the same key again (refused by its conditions, nothing written twice), and the
// call answers that key with its secret.
func TestCreateKeyLandedNotSeenYet(t *testing.T) {
	for _, idemKey := range []string{"", "i"} {
		t.Run("idempotency key "+idemKey, func(t *testing.T) {
			inj := awsfault.New(1, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.AmbiguousTimeout, Rate: 1})
			env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
			svc := keyService(env, t0)
			svc.Keys = &lateKeys{KeyStore: env.Store, hidden: 1}
			req := capacity.KeyRequest{OrgID: "o", Permissions: []string{capacity.PermRead}, IdempotencyKey: idemKey}
			res, err := svc.CreateKey(context.Background(), opPrincipal, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Secret == "" || res.SecretShown || res.Replayed {
				t.Fatalf("answer %+v: want the key with its secret", res)
			}
			got, err := env.Store.Keys().LookupKey(context.Background(), capacity.HashKeySecret(res.Secret))
			if err != nil || got == nil || got.KeyID != res.Key.KeyID {
				t.Fatalf("the answered secret does not find the stored key: %+v, %v", got, err)
			}
			if n := countPrefix(t, env, "APIKEY#"); n != 1 {
				t.Errorf("%d keys stored, want 1", n)
			}
			if n := len(keyAudits(t, env)); n != 1 {
				t.Errorf("%d key audit records, want 1", n)
			}
		})
	}
}

// Two revokes of one key at once: both answer it revoked, one of them wrote.
func TestRevokeRace(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}})
	ctx := context.Background()
	svc := keyService(env, t0)
	// Directly: the second revoke of the key as read loses.
	k, err := env.Store.GetKey(ctx, operatorKey.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	rec := func(id string) capacity.AuditRecord {
		return capacity.AuditRecord{ID: id, Time: t0, Action: capacity.ActionKeyRevoke, Outcome: "ok"}
	}
	if err := env.Store.RevokeKey(ctx, *k, t0, rec("a1")); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.RevokeKey(ctx, *k, t0.Add(time.Second), rec("a2")); !strings.Contains(fmt.Sprint(err), capacity.ErrConflict.Error()) {
		t.Fatalf("second revoke of the key as read: %v, want a conflict", err)
	}
	got, _ := env.Store.GetKey(ctx, operatorKey.KeyID)
	if !got.RevokedAt.Equal(t0) {
		t.Errorf("RevokedAt = %v, want the first revoke's", got.RevokedAt)
	}

	// Through the service, concurrently, with the conflicts AWS reports for transactions
	// that meet on an item (the emulator runs them one at a time).
	inj := awsfault.New(5, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.3})
	env = dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	if err := env.Store.Put(ctx, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}}); err != nil {
		t.Fatal(err)
	}
	svc = keyService(env, t0)
	svc.Attempts = 5
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = svc.RevokeKey(ctx, opPrincipal, capacity.KeyRevocation{KeyID: operatorKey.KeyID}, capacity.RequestMeta{})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("revoke %d: %v", i, err)
		}
	}
	revokes := 0
	for _, a := range keyAudits(t, env) {
		if attr(a, "Action") == capacity.ActionKeyRevoke {
			revokes++
		}
	}
	if revokes != 1 {
		t.Errorf("%d revoke records, want 1: a repeated revoke writes nothing", revokes)
	}
	if got, _ := env.Store.GetKey(ctx, operatorKey.KeyID); got == nil || !got.Revoked {
		t.Errorf("key after the revokes: %+v, want revoked", got)
	}
}

// attr is a string attribute of an item ("" when absent or not a string).
func attr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// lastUsed reads the key item's LastUsedAt (epoch seconds; 0 when absent).
func lastUsed(t *testing.T, env *dynamotest.Env, hash string) int64 {
	t.Helper()
	out, err := env.Client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(env.Store.KeysTable), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "APIKEY#" + hash}, "sk": &types.AttributeValueMemberS{Value: "APIKEY"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var it struct {
		LastUsedAt int64 `dynamodbav:"LastUsedAt"`
	}
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		t.Fatal(err)
	}
	return it.LastUsedAt
}

// TouchKey moves LastUsedAt at most once a minute across writers: a touch within the minute
// fails its condition, which is success for the caller; a missing key is not created.
func TestTouchKey(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}})
	ctx := context.Background()
	keys := env.Store.Keys()
	steps := []struct {
		at   time.Time
		want time.Time
	}{
		{t0, t0},
		{t0.Add(30 * time.Second), t0},
		{t0.Add(59 * time.Second), t0},
		{t0.Add(61 * time.Second), t0.Add(61 * time.Second)},
	}
	for _, st := range steps {
		if err := keys.TouchKey(ctx, operatorKey.Hash, st.at); err != nil {
			t.Fatalf("touch at %v: %v", st.at, err)
		}
		if got := lastUsed(t, env, operatorKey.Hash); got != st.want.Unix() {
			t.Errorf("after a touch at %v: LastUsedAt %d, want %d", st.at, got, st.want.Unix())
		}
	}
	if err := keys.TouchKey(ctx, hashOf(capacity.FixedKeySecret("nobody")), t0); err != nil {
		t.Fatalf("touch of a missing key: %v", err)
	}
	if n := countPrefix(t, env, "APIKEY#"); n != 1 {
		t.Errorf("%d key items after touching a missing key, want 1", n)
	}
}

// A touch the database keeps throttling is an error for the caller to log; nothing is written.
func TestTouchKeyThrottled(t *testing.T) {
	inj := awsfault.New(1, awsfault.Rule{Operation: "UpdateItem", Fault: awsfault.Throttling, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	ctx := context.Background()
	if err := env.Store.Put(ctx, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Store.Keys().TouchKey(ctx, operatorKey.Hash, t0); err == nil {
		t.Fatal("a throttled touch succeeded")
	}
	if got := lastUsed(t, env, operatorKey.Hash); got != 0 {
		t.Errorf("LastUsedAt = %d after a throttled touch, want none", got)
	}
}

func TestConcurrentKeyCreates(t *testing.T) {
	inj := awsfault.New(3, awsfault.Rule{Operation: "TransactWriteItems", Fault: awsfault.TransactionConflict, Rate: 0.3})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	svc := keyService(env, t0)
	svc.Attempts = 5
	// Rounds of four concurrent creates until the injector has made at least one conflict, so
	// the check does not depend on how the goroutines happened to interleave.
	created := 0
	for round := 0; round < 10 && (round == 0 || inj.Count(awsfault.TransactionConflict) == 0); round++ {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = svc.CreateKey(context.Background(), opPrincipal,
					capacity.KeyRequest{OrgID: "o", Permissions: []string{capacity.PermRead}}, capacity.RequestMeta{})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d create %d: %v", round, i, err)
			}
		}
		created += len(errs)
	}
	if inj.Count(awsfault.TransactionConflict) == 0 {
		t.Error("no conflict injected in 10 rounds")
	}
	audits := keyAudits(t, env)
	if len(audits) != created || countPrefix(t, env, "APIKEY#") != created {
		t.Fatalf("%d records, %d keys; want %d, %d", len(audits), countPrefix(t, env, "APIKEY#"), created, created)
	}
	for i, a := range audits {
		if want := fmt.Sprintf("SEQ#%020d", i+1); attr(a, "sk") != want {
			t.Errorf("record %d at %s, want %s", i, attr(a, "sk"), want)
		}
	}
}

// TestKeyByIDIsGetItemOnly: the firing of a scheduled reclaim reads its creator's key with
// GetItem alone (its role may do nothing else on the keys table): a key with an id pointer is
// found, one provisioned before pointers existed is not found rather than scanned for.
func TestKeyByIDIsGetItemOnly(t *testing.T) {
	env := newEnv(t, dynamo.Seed{Keys: []capacity.APIKey{operatorKey}})
	ctx := context.Background()
	legacy := capacity.APIKey{KeyID: "key-legacy", Hash: hashOf(capacity.FixedKeySecret("legacy")), OrgID: "org-2", Permissions: []string{capacity.PermCapacity}}
	item, _ := attributevalue.MarshalMap(map[string]any{"pk": "APIKEY#" + legacy.Hash, "sk": "APIKEY", "type": "apikey",
		"KeyID": legacy.KeyID, "Hash": legacy.Hash, "OrgID": legacy.OrgID, "Permissions": legacy.Permissions, "Revoked": false})
	if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.KeysTable), Item: item}); err != nil {
		t.Fatal(err)
	}
	env.Calls.Reset()
	for _, tc := range []struct {
		id    string
		found bool
	}{{operatorKey.KeyID, true}, {"key-legacy", false}, {"key-none", false}} {
		k, err := env.Store.KeyByID(ctx, tc.id)
		switch {
		case tc.found && (err != nil || k.KeyID != tc.id || !k.Operator):
			t.Errorf("KeyByID(%s) = %+v, %v", tc.id, k, err)
		case !tc.found && capacity.ErrorCode(err) != capacity.CodeNotFound:
			t.Errorf("KeyByID(%s) = %+v, %v; want not found", tc.id, k, err)
		}
	}
	for op, n := range env.Calls.Snapshot() {
		if op != "GetItem" && n > 0 {
			t.Errorf("KeyByID made %d %s calls; GetItem only", n, op)
		}
	}
	// GetKey, for key management, still finds the legacy key.
	if k, err := env.Store.GetKey(ctx, "key-legacy"); err != nil || k.KeyID != "key-legacy" {
		t.Errorf("GetKey(key-legacy) = %+v, %v", k, err)
	}
}

// A key list's cursor never carries what a key is stored under: for every page size, no
// cursor holds (in any encoding the cursor could be read in) the hash of any key, and every
// key is still listed once. A cursor naming a key that does not exist is refused.
func TestListKeysCursorHoldsNoHash(t *testing.T) {
	keys := readerKeys(5)
	env := newEnv(t, dynamo.Seed{Keys: keys})
	svc := keyService(env, t0)
	ctx := context.Background()
	for _, limit := range []int{1, 2, 4, 5} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			seen := 0
			for cursor, pages := "", 0; pages < 10; pages++ {
				page, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{Limit: limit, Cursor: cursor})
				if err != nil {
					t.Fatal(err)
				}
				seen += len(page.Keys)
				if cursor = page.NextCursor; cursor == "" {
					break
				}
				decoded, _ := base64.RawURLEncoding.DecodeString(cursor)
				text := strings.ToLower(cursor + " " + string(decoded))
				if strings.Contains(text, "apikey#") {
					t.Errorf("cursor %q (%s) holds a storage key", cursor, decoded)
				}
				for _, k := range keys {
					if strings.Contains(text, k.Hash[:16]) {
						t.Errorf("cursor %q (%s) holds key %s's hash", cursor, decoded, k.KeyID)
					}
				}
			}
			if seen != len(keys) {
				t.Errorf("listed %d keys, want %d", seen, len(keys))
			}
		})
	}
	made := base64.RawURLEncoding.EncodeToString([]byte(`["v1","keys","key-404"]`))
	if _, err := svc.ListKeys(ctx, opPrincipal, capacity.PageRequest{Cursor: made}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("cursor of a key that does not exist: %v, want invalid_request", err)
	}
}
