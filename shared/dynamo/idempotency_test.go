package dynamo_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Records written before Idempotency-Key scopes named the calling key (scope "<org>#<key>")
// keep binding as they did, for the org, until they expire: a retry across the change
// replays instead of applying again. New records are per calling key.
func TestLegacyIdempotencyRecordsBindUntilTheyExpire(t *testing.T) {
	keyA := capacity.Principal{KeyID: "key-a", OrgID: "owner", Permissions: []string{capacity.PermCapacity}}
	keyB := capacity.Principal{KeyID: "key-b", OrgID: "owner", Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}, IdempotencyKey: "k1"}
	other := req
	other.UnitIDs = []string{"u1"}
	tests := []struct {
		name     string
		p        capacity.Principal
		req      capacity.CapacityRequest
		after    time.Duration // since the first call
		replayed bool
		code     capacity.Code
	}{
		{"the same key retries", keyA, req, time.Minute, true, ""},
		{"another key of the org retries (as before the change)", keyB, req, time.Minute, true, ""},
		{"another request under the key", keyB, other, time.Minute, false, capacity.CodeIdempotencyKeyReused},
		{"after the record expired", keyB, req, 25 * time.Hour, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, seed(4, 2))
			ctx := context.Background()
			now := t0.Add(time.Hour)
			svc := &capacity.Service{Store: env.Store, Now: func() time.Time { return now }, Workflow: env.Workflow(t)}
			first, err := svc.Reclaim(ctx, keyA, req, capacity.RequestMeta{})
			if err != nil {
				t.Fatal(err)
			}
			moveToLegacyScope(t, env.Plain, env.Store.Table)
			now = now.Add(tt.after)
			res, err := svc.Reclaim(ctx, tt.p, tt.req, capacity.RequestMeta{})
			if capacity.ErrorCode(err) != tt.code && (tt.code != "" || err != nil) {
				t.Fatalf("err = %v, want %q", err, tt.code)
			}
			if err != nil {
				return
			}
			if res.Replayed != tt.replayed || (tt.replayed && res.ReclaimID != first.ReclaimID) {
				t.Errorf("replayed = %v (reclaim %q, first %q), want %v", res.Replayed, res.ReclaimID, first.ReclaimID, tt.replayed)
			}
		})
	}
}

// moveToLegacyScope rewrites the table's one idempotency record as the code before the
// change wrote it: under "IDEM#<org>#<key>", scope "<org>#<key>".
func moveToLegacyScope(t *testing.T, client *dynamodb.Client, table string) {
	t.Helper()
	ctx := context.Background()
	out, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for _, it := range out.Items {
		sk := it["sk"].(*types.AttributeValueMemberS).Value
		if !strings.HasPrefix(sk, "IDEM#") {
			continue
		}
		scope := capacity.LegacyIdempotencyScope(strings.TrimPrefix(sk, "IDEM#"))
		if scope == "" {
			t.Fatalf("record %s has no legacy scope", sk)
		}
		if _, err := client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(table),
			Key: map[string]types.AttributeValue{"pk": it["pk"], "sk": it["sk"]}}); err != nil {
			t.Fatal(err)
		}
		it["sk"], it["Scope"] = &types.AttributeValueMemberS{Value: "IDEM#" + scope}, &types.AttributeValueMemberS{Value: scope}
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: it}); err != nil {
			t.Fatal(err)
		}
		moved++
	}
	if moved != 1 {
		t.Fatalf("moved %d idempotency records, want 1", moved)
	}
}
