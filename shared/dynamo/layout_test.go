package dynamo_test

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
)

func str(v types.AttributeValue) string {
	if s, ok := v.(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}

// LoadNode reads the node, its reservations and live VMs with one Query, and the caller's own
// idempotency record (only it) with one GetItem; both count in the call's read stats.
func TestLoadNodeReadsLiveStateAndTheCallersRecord(t *testing.T) {
	s := seed(4, 2)
	s.VMs = append(s.VMs, capacity.VM{ID: "vm-old", NodeID: "n1", Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, State: capacity.VMTerminated, UpdatedAt: t0, Version: 3})
	env := newEnv(t, s)
	ctx := context.Background()
	st, err := env.Store.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, scope := range []string{"org#k1", "org#k2"} {
		c := capacity.Commit{Node: st.Node,
			Idempotency: &capacity.IdempotencyRecord{Scope: scope, NodeID: "n1", Fingerprint: "f", Result: []byte(`{}`), CreatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)},
			Audit:       capacity.AuditRecord{ID: "a-" + scope, Time: t0, NodeID: "n1", Action: capacity.ActionReclaim, Outcome: "ok"}}
		if err := env.Store.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, scope string
		wantItems   int
		wantCalls   map[string]int64
	}{
		{"no key", "", 4, map[string]int64{"Query": 1}},
		{"the caller's key", "org#k1", 5, map[string]int64{"Query": 1, "GetItem": 1}},
		{"a key never used", "org#k9", 4, map[string]int64{"Query": 1, "GetItem": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env.Calls.Reset()
			c, stats := capacity.WithCallStats(ctx)
			st, err := env.Store.LoadNode(c, "n1", tt.scope)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.VMs) != 2 {
				t.Errorf("VMs %v: want the live ones only", capacity.VMIDs(st.VMs))
			}
			if got := st.Idempotency; (tt.wantItems == 5) != (got != nil) || (got != nil && got.Scope != tt.scope) {
				t.Errorf("idempotency record %+v for scope %q", got, tt.scope)
			}
			snap := stats.Snapshot()
			if snap.ItemsRead != tt.wantItems || snap.BytesRead < 100*tt.wantItems {
				t.Errorf("read stats %d items, %d bytes; want %d items", snap.ItemsRead, snap.BytesRead, tt.wantItems)
			}
			got := env.Calls.Snapshot()
			if len(got) != len(tt.wantCalls) {
				t.Errorf("SDK calls %v, want %v", got, tt.wantCalls)
			}
			for op, n := range tt.wantCalls {
				if got[op] != n {
					t.Errorf("SDK calls %v, want %v", got, tt.wantCalls)
				}
			}
		})
	}
}

// MarkTerminated moves the VM out of the decision partition into the node's history, kept for
// the retention (never less than 90 days).
func TestMarkTerminatedMovesTheVMToHistory(t *testing.T) {
	tests := []struct {
		name      string
		retention time.Duration
		want      time.Duration
	}{
		{"default", 0, dynamo.DefaultRetention},
		{"configured", 200 * 24 * time.Hour, 200 * 24 * time.Hour},
		{"below the minimum", time.Hour, dynamo.MinRetention},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, op := committed(t, nil)
			env.Store.Retention = tt.retention
			now := t0.Add(2 * time.Hour)
			if err := env.Store.MarkTerminated(context.Background(), op, "vm00", now); err != nil {
				t.Fatal(err)
			}
			var hist map[string]types.AttributeValue
			for _, it := range env.Items(t, env.Store.Table) {
				if str(it["sk"]) != "VM#vm00" {
					continue
				}
				if str(it["pk"]) != "NODE#n1#HIST" {
					t.Fatalf("VM still at %s", str(it["pk"]))
				}
				hist = it
			}
			if hist == nil || str(hist["State"]) != string(capacity.VMTerminated) || str(hist["ReclaimID"]) != op.ID {
				t.Fatalf("history item %v", hist)
			}
			exp, _ := strconv.ParseInt(hist["expiresAt"].(*types.AttributeValueMemberN).Value, 10, 64)
			if want := now.Add(tt.want).Unix(); exp != want {
				t.Errorf("expires at %s, want %s", time.Unix(exp, 0).UTC(), time.Unix(want, 0).UTC())
			}
		})
	}
}

// A completed operation expires a retention after the end, with its outcomes folded into it
// (outcomes recorded by an earlier attempt of a re-driven operation too); the outcome items
// expire a day after they were recorded.
// A failed one, whose failed VMs stay terminating and keep their units, never expires, nor
// does a failure outcome: else a re-drive would answer 404 and nothing could free the units.
func TestEndedOperationExpiresWithItsOutcomes(t *testing.T) {
	ctx := context.Background()
	_, s, op := committed(t, nil)
	expiresAt := func(sk string) int64 {
		for _, it := range dynamoItems(t, s) {
			if str(it["pk"]) == "NODE#n1#OP#"+op.ID && str(it["sk"]) == sk {
				if n, ok := it["expiresAt"].(*types.AttributeValueMemberN); ok {
					v, _ := strconv.ParseInt(n.Value, 10, 64)
					return v
				}
				return 0
			}
		}
		t.Fatalf("no item %s", sk)
		return 0
	}
	first := t0.Add(time.Hour)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.BeginTermination(ctx, op, "arn:1", first))
	must(s.RecordOutcome(ctx, op, "vm00", capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: first, Attempt: 1}))
	must(s.RecordOutcome(ctx, op, "vm01", capacity.VMOutcome{Outcome: capacity.OutcomeFailed, Error: "refused", At: first, Attempt: 1}))
	if got := expiresAt("OP"); got != 0 {
		t.Errorf("a running operation expires at %d", got)
	}
	read, err := s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.EndOperation(ctx, *read, capacity.OpFailed, first))
	held := func(when string) {
		t.Helper()
		for _, sk := range []string{"OP", "VM#vm01"} {
			if got := expiresAt(sk); got != 0 {
				t.Errorf("%s: %s, holding a terminating VM, expires at %s", when, sk, time.Unix(got, 0).UTC())
			}
		}
	}
	held("failed")
	// Re-driven, and failed again: still held (the re-drive and the end both drop any expiry).
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.RedriveOperation(ctx, *read, capacity.AuditRecord{ID: "a-r1", Time: first, NodeID: "n1", Action: capacity.ActionRetry, Outcome: "ok"}, first))
	held("re-driven")
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.BeginTermination(ctx, *read, "arn:2", first))
	must(s.RecordOutcome(ctx, *read, "vm01", capacity.VMOutcome{Outcome: capacity.OutcomeFailed, Error: "refused", At: first, Attempt: 2}))
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.EndOperation(ctx, *read, capacity.OpFailed, first))
	held("failed again")
	// Re-driven much later, the failed VM succeeds and the operation ends again.
	later := first.Add(300 * 24 * time.Hour)
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.RedriveOperation(ctx, *read, capacity.AuditRecord{ID: "a-r", Time: later, NodeID: "n1", Action: capacity.ActionRetry, Outcome: "ok"}, later))
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.BeginTermination(ctx, *read, "arn:3", later))
	must(s.RecordOutcome(ctx, *read, "vm01", capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: later, Attempt: 3}))
	read, err = s.GetOperation(ctx, "n1", op.ID)
	must(err)
	must(s.EndOperation(ctx, *read, capacity.OpCompleted, later))
	if got, want := expiresAt("OP"), later.Add(dynamo.DefaultRetention).Unix(); got != want {
		t.Errorf("OP expires at %s, want %s", time.Unix(got, 0).UTC(), time.Unix(want, 0).UTC())
	}
	// The outcome items expire a day after they were recorded; the end folded them into the
	// operation, whose read shows them once the items are gone.
	for sk, at := range map[string]time.Time{"VM#vm00": first, "VM#vm01": later} {
		if got, want := expiresAt(sk), at.Add(24*time.Hour).Unix(); got != want {
			t.Errorf("%s expires at %s, want %s (a day after it was recorded)", sk, time.Unix(got, 0).UTC(), time.Unix(want, 0).UTC())
		}
	}
	ended, err := s.GetOperation(ctx, "n1", op.ID)
	must(err)
	for _, sk := range []string{"VM#vm00", "VM#vm01"} {
		if _, err := s.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(s.Table), Key: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "NODE#n1#OP#" + op.ID}, "sk": &types.AttributeValueMemberS{Value: sk}}}); err != nil {
			t.Fatal(err)
		}
	}
	expired, err := s.GetOperation(ctx, "n1", op.ID)
	must(err)
	if !reflect.DeepEqual(expired.Outcomes, ended.Outcomes) || expired.Outcomes["vm00"].Outcome != capacity.OutcomeTerminated || expired.Outcomes["vm01"].Attempt != 3 {
		t.Errorf("outcomes once their items expired:\n got %+v\nwant %+v", expired.Outcomes, ended.Outcomes)
	}
}

func dynamoItems(t *testing.T, s *dynamo.Store) []map[string]types.AttributeValue {
	t.Helper()
	out, err := s.Client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(s.Table)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Items
}
