package dynamo_test

import (
	"context"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// trailWorld is a reservation r1 whose history mixes changes with calls that changed nothing:
// five reclaims, each after a dry run and an audience org's refusal, the last replayed twice
// under its Idempotency-Key.
func trailWorld(t *testing.T) (*dynamotest.Env, *capacity.Service) {
	t.Helper()
	env := newEnv(t, seed(6, 5))
	svc := auditService(env.Store)
	ctx := context.Background()
	aud := capacity.Principal{KeyID: "k-a", OrgID: "aud", Permissions: []string{capacity.PermCapacity, capacity.PermRead}}
	for i, u := range []string{"u0", "u1", "u2", "u3", "u4"} {
		req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{u}}
		dry := req
		dry.DryRun = true
		if _, err := svc.Reclaim(ctx, auditOwner, dry, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Reclaim(ctx, aud, req, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeForbidden {
			t.Fatalf("the audience's reclaim: %v, want forbidden", err)
		}
		if i == 4 {
			req.IdempotencyKey = "last"
		}
		for range 1 + 2*(i/4) {
			if _, err := svc.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return env, svc
}

// reservationTrail pages through one of r1's trails, limit records a page.
func reservationTrail(t *testing.T, svc *capacity.Service, chain capacity.NodeChain, limit int) []capacity.AuditRecord {
	t.Helper()
	var recs []capacity.AuditRecord
	page := capacity.PageRequest{Limit: limit}
	for pages := 0; ; pages++ {
		p, err := svc.ListReservationAudit(context.Background(), auditOwner, "n1", "r1", chain, page)
		if err != nil {
			t.Fatalf("%s trail, page %d: %v", chain, pages+1, err)
		}
		recs = append(recs, p.Records...)
		if p.NextCursor == "" || pages > 50 {
			return recs
		}
		page.Cursor = p.NextCursor
	}
}

// ids are the records' ids.
func ids(recs []capacity.AuditRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// newestFirst is the chain's records about r1, newest first.
func newestFirst(recs []capacity.AuditRecord) []capacity.AuditRecord {
	var out []capacity.AuditRecord
	for _, r := range slices.Backward(recs) {
		if r.ReservationID == "r1" {
			out = append(out, r)
		}
	}
	return out
}

// A reservation's audit shows its changes, newest first, page after page on any page size,
// whatever dry runs, refusals (an audience org's) and replays came between them: no page
// refuses the list's own cursor, none repeats or skips a record. The calls about it that
// changed nothing are its calls trail, newest first too.
func TestReservationTrailPagesPastCallsThatChangedNothing(t *testing.T) {
	env, svc := trailWorld(t)
	_, changes, _ := wholeChain(t, svc, "n1", capacity.ChainChanges)
	_, calls, _ := wholeChain(t, svc, "n1", capacity.ChainCalls)
	wantChanges, wantCalls := ids(newestFirst(changes)), ids(newestFirst(calls))
	if len(wantChanges) != 5 || len(wantCalls) != 12 {
		t.Fatalf("%d changes and %d calls about r1, want 5 and 12 (5 dry runs, 5 refusals, 2 replays)", len(wantChanges), len(wantCalls))
	}
	for _, limit := range []int{1, 2, 3, 7, 50} {
		if got := ids(reservationTrail(t, svc, capacity.ChainChanges, limit)); !slices.Equal(got, wantChanges) {
			t.Errorf("limit %d: changes %v, want newest first %v", limit, got, wantChanges)
		}
		if got := ids(reservationTrail(t, svc, capacity.ChainCalls, limit)); !slices.Equal(got, wantCalls) {
			t.Errorf("limit %d: calls %v, want newest first %v", limit, got, wantCalls)
		}
	}
	first, err := svc.ListReservationAudit(context.Background(), auditOwner, "n1", "r1", "", capacity.PageRequest{Limit: 1})
	if err != nil || len(first.Records) != 1 || first.Records[0].Outcome != "ok" || first.Records[0].Seq != changes[len(changes)-1].Seq {
		t.Errorf("first page %+v, %v: want the last reclaim", first, err)
	}
	if _, err := svc.ListReservationAudit(context.Background(), auditOwner, "n1", "r1", "everything", capacity.PageRequest{}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
		t.Errorf("an unknown trail: %v, want invalid_request", err)
	}

	// Calls records written before the trails were apart carry the changes trail's key: the
	// changes trail skips them, on every page size. Those re-keyed here have seqs no change
	// has: the emulator orders index entries of equal sort key at random on every query,
	// which AWS orders by their table keys (which its start keys carry).
	ctx := context.Background()
	out, err := env.Plain.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(env.Store.AuditTable)})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range out.Items {
		if it["pk"].(*types.AttributeValueMemberS).Value != "NODE#n1#CALLS" || it["sk"].(*types.AttributeValueMemberS).Value <= "SEQ#00000000000000000005" {
			continue
		}
		it["resKey"] = &types.AttributeValueMemberS{Value: "NODE#n1#RES#r1"}
		if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.AuditTable), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{1, 2, 3, 50} {
		if got := ids(reservationTrail(t, svc, capacity.ChainChanges, limit)); !slices.Equal(got, wantChanges) {
			t.Errorf("with earlier calls records, limit %d: changes %v, want %v", limit, got, wantChanges)
		}
	}
}
