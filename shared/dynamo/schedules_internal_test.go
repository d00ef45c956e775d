package dynamo

import (
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"

	"github.com/openrelay/capacity/shared/capacity"
)

// The stored names of a scheduled reclaim (see TestStoredAttributeNames), its round trip, and
// its key: its own partition under its node, apart from the decision partition.
func TestScheduledItemLayout(t *testing.T) {
	sr := capacity.ScheduledReclaim{ID: "srcl_1", NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}, Reason: "r",
		GraceSeconds: 30, At: end, State: capacity.ScheduledRefused, CreatorKeyID: "k", CreatorOrgID: "o", CreatorOperator: true,
		CreatedAt: at, UpdatedAt: end, ReclaimID: "rcl_1", Code: capacity.CodeOutsideTerm, Detail: "d", FiredAt: &end, CancelledAt: &at, Version: 2}
	it := newScheduledItem(sr, DefaultRetention)
	want := "At CancelledAt Code CreatedAt CreatorKeyID CreatorOperator CreatorOrgID Detail FiredAt GraceSeconds ID NodeID Reason ReclaimID ReservationID State UnitIDs UpdatedAt Version expiresAt gsi1pk gsi1sk pk sk type"
	if got := attributeNames(t, it); got != want {
		t.Errorf("attributes\n got %s\nwant %s", got, want)
	}
	item, err := attributevalue.MarshalMap(it)
	if err != nil {
		t.Fatal(err)
	}
	var back scheduledItem
	if err := attributevalue.UnmarshalMap(item, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.scheduled(); !reflect.DeepEqual(got, sr) {
		t.Errorf("round trip\n got %+v\nwant %+v", got, sr)
	}
	if it.ExpiresAt != expiry(end.Add(DefaultRetention)) {
		t.Errorf("a fired one expires at %d", it.ExpiresAt)
	}
	sr.State = capacity.ScheduledPending
	if newScheduledItem(sr, DefaultRetention).ExpiresAt != 0 {
		t.Error("a pending one expires")
	}
	if pk := schedPK("n-1.a", "srcl_x"); nodeOfPK(pk) != "n-1.a" || pk == nodePK("n-1.a") {
		t.Errorf("key %s", pk)
	}
}
