package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
)

// TestCancellingAReservationCancelsItsScheduledReclaims: two reclaims scheduled an hour
// ahead, then the reservation cancelled through the API: the reservation's list shows both
// cancelled with the cancel's reason, the owner org's count of pending scheduled reclaims is
// back where it was, and their one-time schedules are gone.
func TestCancellingAReservationCancelsItsScheduledReclaims(t *testing.T) {
	node := newNode(t, nil)
	ctx := context.Background()
	pending := func() int {
		t.Helper()
		n, err := store.PendingScheduled(ctx, demo.OrgOwner)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := pending()
	at := time.Now().UTC().Add(time.Hour).Truncate(time.Second)
	var ids []string
	for i := range 2 {
		r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{
			"unitIds": []string{"gpu-2"}, "at": at.Add(time.Duration(i) * time.Minute).Format(time.RFC3339),
		})
		id, _ := r.json(t)["id"].(string)
		if r.Status != http.StatusAccepted || id == "" {
			t.Fatalf("schedule: %d %s", r.Status, r.Body)
		}
		ids = append(ids, id)
	}
	if n := pending(); n != before+2 {
		t.Fatalf("pending scheduled reclaims of %s: %d, want %d", demo.OrgOwner, n, before+2)
	}

	c := call(t, http.MethodPost, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/cancel", keyOperator,
		map[string]any{"reason": "e2e: contract ended"})
	if c.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", c.Status, c.Body)
	}
	list := call(t, http.MethodGet, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID+"/scheduled-reclaims", keyOwner, nil)
	var page struct {
		ScheduledReclaims []map[string]any `json:"scheduledReclaims"`
	}
	if list.Status != http.StatusOK || json.Unmarshal(list.Body, &page) != nil || len(page.ScheduledReclaims) != 2 {
		t.Fatalf("list: %d %s", list.Status, list.Body)
	}
	for _, sr := range page.ScheduledReclaims {
		detail, _ := sr["detail"].(string)
		if sr["state"] != "cancelled" || sr["cancelledAt"] == nil || sr["code"] != string(capacity.CodeReservationNotActive) ||
			!strings.Contains(detail, "e2e: contract ended") {
			t.Errorf("listed %v, want cancelled with the reservation's cancel as its reason", sr)
		}
	}
	if n := pending(); n != before {
		t.Errorf("pending scheduled reclaims of %s: %d, want %d again", demo.OrgOwner, n, before)
	}
	sched := scheduler.NewFromConfig(stack.AWSConfig(endpoint))
	for _, id := range ids {
		_, err := sched.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(id), GroupName: aws.String(outputs["ScheduleGroupName"])})
		var missing *schedtypes.ResourceNotFoundException
		if !errors.As(err, &missing) {
			t.Errorf("schedule %s: %v, want it deleted", id, err)
		}
	}
}
