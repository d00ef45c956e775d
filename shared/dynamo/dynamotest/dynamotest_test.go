package dynamotest_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/table"
)

// The emulator expires nothing a test writes. Its reaper deletes, every 30 s by the real
// clock, each item whose TTL has passed, and tests run on fixed clocks in the past: with TTL
// on, an Idempotency-Key record (TTL a day after t0) vanished when a tick fell between a call
// and its repeat, and the repeat applied again (TestScheduleReclaimIdempotencyKey failed so
// under load, a slow run widening the window; TestReclaimReadShowsNoticesAfterTheirItemsExpire
// likewise).
func TestTablesExpireNothing(t *testing.T) {
	env := dynamotest.New(t)
	names := []string{env.Store.Table, env.Store.AuditTable, env.Store.KeysTable, env.Store.LimitsTable}
	if len(names) != len(table.All) {
		t.Fatalf("%d tables checked, %d defined", len(names), len(table.All))
	}
	for _, name := range names {
		out, err := env.Plain.DescribeTimeToLive(context.Background(), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		if d := out.TimeToLiveDescription; d != nil && d.TimeToLiveStatus != "" && d.TimeToLiveStatus != types.TimeToLiveStatusDisabled {
			t.Errorf("table %s: TTL %s on attribute %s; want it off", name, d.TimeToLiveStatus, aws.ToString(d.AttributeName))
		}
	}
}
