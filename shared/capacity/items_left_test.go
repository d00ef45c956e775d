package capacity_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/table"
)

// The items a typical reclaim (2 spot VMs, run to its end) leaves in the state table, by
// kind, and how long each stays (its TTL, in days after the reclaim, rounded): what storage
// a million reclaims keep paying for. The operation and the VMs' history stay for the
// retention (400 days); what only guards a run while it may be live goes a day after.
// Kinds: "OP OP" the operation, "OP VM#" a VM's outcome, "OP CLAIM#" a terminate claim,
// "OP REPORT#" a report claim, "OP NOTICE#" a VM's notice, "HIST VM#" a terminated VM.
func TestItemsLeftAfterATypicalReclaim(t *testing.T) {
	tests := []struct {
		grace int
		want  map[string]string // kind -> "count x TTL days"
	}{
		{0, map[string]string{
			"OP OP": "1 x 400d", "HIST VM#": "2 x 400d", "OP VM#": "2 x 1d",
			"OP CLAIM#": "2 x 1d", "OP REPORT#": "1 x 1d",
		}},
		{120, map[string]string{
			"OP OP": "1 x 400d", "HIST VM#": "2 x 400d", "OP VM#": "2 x 1d", "OP NOTICE#": "2 x 1d",
			"OP CLAIM#": "2 x 1d", "OP REPORT#": "1 x 1d",
		}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("grace-%d", tt.grace), func(t *testing.T) {
			r := meterReclaim(t, 2, tt.grace, "")
			got := leftByKind(t, r.left[table.State.Suffix])
			if !maps.Equal(got, tt.want) {
				t.Errorf("items left:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// leftByKind counts items by the kind their sort key names (its prefix) and their TTL.
func leftByKind(t *testing.T, items []map[string]types.AttributeValue) map[string]string {
	t.Helper()
	ttls := map[string][]int{}
	for _, it := range items {
		// Keys as docs/architecture.md lists them, the ids elided: "OP OUTCOME#", "HIST VM#".
		pk := strings.Split(it[table.PartitionKey].(*types.AttributeValueMemberS).Value, "#")
		sk := it[table.SortKey].(*types.AttributeValueMemberS).Value
		if i := strings.Index(sk, "#"); i >= 0 {
			sk = sk[:i+1]
		}
		kind := pk[len(pk)-1] + " " + sk
		if len(pk) >= 4 && pk[2] == "OP" {
			kind = "OP " + sk
		}
		days := -1
		if v, ok := it[table.TTLAttribute].(*types.AttributeValueMemberN); ok {
			var sec int64
			fmt.Sscan(v.Value, &sec)
			days = int(math.Round(float64(sec-t0.Unix()) / 86400))
		}
		ttls[kind] = append(ttls[kind], days)
	}
	out := map[string]string{}
	for kind, ds := range ttls {
		slices.Sort(ds)
		if ds[0] != ds[len(ds)-1] {
			out[kind] = fmt.Sprintf("%d x %v days", len(ds), ds)
			continue
		}
		out[kind] = fmt.Sprintf("%d x %dd", len(ds), ds[0])
	}
	return out
}

// A reclaim with a grace shows each VM's eviction notice when read, also once the notice
// items have expired (a day after the grace): the VM's outcome carries a copy.
func TestReclaimReadShowsNoticesAfterTheirItemsExpire(t *testing.T) {
	r := meterReclaim(t, 2, 120, "")
	ctx := context.Background()
	before, err := r.env.Store.GetOperation(ctx, "node-a", r.id)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Notices) != 2 {
		t.Fatalf("notices %+v, want the 2 VMs'", before.Notices)
	}
	for _, it := range r.left[table.State.Suffix] {
		if sk := it[table.SortKey].(*types.AttributeValueMemberS).Value; strings.HasPrefix(sk, "NOTICE#") {
			// As DynamoDB's TTL deletes it.
			if _, err := r.env.Plain.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(r.env.Store.Table),
				Key: map[string]types.AttributeValue{table.PartitionKey: it[table.PartitionKey], table.SortKey: it[table.SortKey]}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	after, err := r.env.Store.GetOperation(ctx, "node-a", r.id)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Notices, before.Notices) {
		t.Errorf("notices once their items expired:\n got %+v\nwant %+v", after.Notices, before.Notices)
	}
}
