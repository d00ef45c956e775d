package dynamo_test

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// A reservation's trail reads whole records, as the node's chain holds them, although its
// index stores each record's keys only (a record is not stored twice, for good), on every
// page size, newest first.
func TestReservationTrailReadsWholeRecordsFromAKeysOnlyIndex(t *testing.T) {
	env := newEnv(t, seed(4, 3))
	svc := auditService(env.Store)
	ctx := context.Background()
	for _, u := range []string{"u0", "u1", "u2"} {
		if _, err := svc.Reclaim(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{u}, Reason: "job " + u}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	// What the index stores: the table's keys and its own, nothing else.
	ix, err := env.Plain.Query(ctx, &dynamodb.QueryInput{
		TableName: aws.String(env.Store.AuditTable), IndexName: aws.String(table.AuditByReservationIndex),
		KeyConditionExpression:    aws.String("#k = :k"),
		ExpressionAttributeNames:  map[string]string{"#k": table.AuditByReservationKey},
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": &types.AttributeValueMemberS{Value: "NODE#n1#RES#r1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ix.Items) != 3 {
		t.Fatalf("%d index entries, want 3", len(ix.Items))
	}
	for _, it := range ix.Items {
		var names []string
		for k := range it {
			names = append(names, k)
		}
		slices.Sort(names)
		if want := []string{table.PartitionKey, table.AuditByReservationKey, table.SortKey}; !slices.Equal(names, want) {
			t.Errorf("index entry holds %v, want its keys only %v", names, want)
		}
	}
	_, chain, _ := wholeChain(t, svc, "n1", capacity.ChainChanges)
	bySeq := map[int64]capacity.AuditRecord{}
	for _, r := range chain {
		bySeq[r.Seq] = r
	}
	for _, limit := range []int{1, 2, 3, 50} {
		var got []int64
		page := capacity.PageRequest{Limit: limit}
		for {
			p, err := svc.ListReservationAudit(ctx, auditOwner, "n1", "r1", "", page)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Records {
				got = append(got, r.Seq)
				if !reflect.DeepEqual(r, bySeq[r.Seq]) {
					t.Errorf("limit %d: record %d\n got %+v\nwant %+v (the chain's)", limit, r.Seq, r, bySeq[r.Seq])
				}
			}
			if p.NextCursor == "" {
				break
			}
			page.Cursor = p.NextCursor
		}
		if !slices.Equal(got, []int64{4, 3, 2}) && !slices.Equal(got, []int64{3, 2, 1}) {
			t.Errorf("limit %d: seqs %v, want the three reclaims newest first", limit, got)
		}
	}
}
