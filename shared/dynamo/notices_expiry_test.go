package dynamo_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

// A notice item expires a day after the grace it announced: the VM's outcome carries a copy.
// A VM left without an outcome by an operation that failed (it stays terminating, held) keeps
// its notice item for the retention from the failure, and the read still shows its notice.
func TestNoticesOutliveTheirItemsOnlyThroughAnOutcome(t *testing.T) {
	ctx := context.Background()
	env, s, op := committed(t, nil)
	graceEnd := t0.Add(2 * time.Minute)
	for _, vm := range []string{"vm00", "vm01"} {
		if err := s.RecordNotice(ctx, op, vm, capacity.VMNotice{State: capacity.NoticeDelivered, At: t0, TerminateAfter: graceEnd}); err != nil {
			t.Fatal(err)
		}
	}
	read, err := s.GetOperation(ctx, "n1", op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RecordOutcome(ctx, *read, "vm00", capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: graceEnd, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkTerminated(ctx, *read, "vm00", graceEnd); err != nil {
		t.Fatal(err)
	}
	if read, err = s.GetOperation(ctx, "n1", op.ID); err != nil {
		t.Fatal(err)
	}
	failedAt := graceEnd.Add(time.Hour)
	if err := s.FailOperation(ctx, *read, "restarts exhausted", failedAt); err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Time{
		"NOTICE#vm00": graceEnd.Add(24 * time.Hour),          // its outcome carries it
		"NOTICE#vm01": failedAt.Add(dynamo.DefaultRetention), // held, no outcome
	}
	for _, it := range env.Items(t, env.Store.Table) {
		sk := str(it["sk"])
		w, ok := want[sk]
		if !ok || str(it["pk"]) != "NODE#n1#OP#"+op.ID {
			continue
		}
		n, _ := it["expiresAt"].(*types.AttributeValueMemberN)
		var got int64
		if n != nil {
			got, _ = strconv.ParseInt(n.Value, 10, 64)
		}
		if got != w.Unix() {
			t.Errorf("%s expires %s, want %s", sk, time.Unix(got, 0).UTC(), w)
		}
		delete(want, sk)
	}
	if len(want) != 0 {
		t.Errorf("notice items missing: %v", want)
	}
}
