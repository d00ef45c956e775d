package dynamo_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// The operation item keeps what the notices and reports need (grace, owner, victims), and an
// operation written without them (before they existed) still reads, with them empty.
func TestOperationKeepsGraceOwnerAndVictims(t *testing.T) {
	ctx := context.Background()
	victims := []capacity.Victim{
		{VMID: "vm00", OrgID: "buyer-a", UnitIDs: []string{"u0"}},
		{VMID: "vm01", OrgID: "buyer-b", UnitIDs: []string{"u1", "u3"}},
	}
	tests := []struct {
		name  string
		apply func(op *capacity.Operation)
	}{
		{name: "written at commit", apply: func(op *capacity.Operation) {
			op.TerminateAfter, op.OwnerOrgID, op.Victims = t0.Add(90*time.Second), "owner", victims
		}},
		{name: "written before grace and events", apply: func(*capacity.Operation) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := dynamotest.New(t)
			if err := env.Store.Put(ctx, seed(4, 3)); err != nil {
				t.Fatal(err)
			}
			st, err := env.Store.LoadNode(ctx, "n1", "")
			if err != nil {
				t.Fatal(err)
			}
			c := reclaimCommit(st, st.VMs[:2])
			c.Audit.Via, c.Audit.EventID = capacity.ViaEvent, "ev-1"
			tt.apply(c.Operation)
			if err := env.Store.Commit(ctx, c); err != nil {
				t.Fatal(err)
			}
			got, err := env.Store.GetOperation(ctx, "n1", "rcl_1")
			if err != nil {
				t.Fatal(err)
			}
			want := *c.Operation
			if !got.TerminateAfter.Equal(want.TerminateAfter) || got.OwnerOrgID != want.OwnerOrgID || !reflect.DeepEqual(got.Victims, want.Victims) {
				t.Errorf("read terminateAfter %v owner %q victims %+v; want %v %q %+v",
					got.TerminateAfter, got.OwnerOrgID, got.Victims, want.TerminateAfter, want.OwnerOrgID, want.Victims)
			}
			listed, _, err := env.Store.OperationsInState(ctx, capacity.OpPendingStart, t0.Add(time.Hour), "", 10)
			if err != nil || len(listed) != 1 {
				t.Fatalf("listed %v, %v", listed, err)
			}
			if !reflect.DeepEqual(listed[0].Victims, want.Victims) {
				t.Errorf("listed victims %+v, want %+v", listed[0].Victims, want.Victims)
			}
		})
	}
}

// The audit item says how the call came and which event carried it.
func TestAuditRecordsViaAndEventID(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(1, 0))
	rec := capacity.AuditRecord{ID: "a9", Time: t0, NodeID: "n1", Action: capacity.ActionReclaim, Outcome: "ok",
		Via: capacity.ViaSchedule, EventID: "ev-7"}
	if err := env.Store.AppendAudit(ctx, rec); err != nil {
		t.Fatal(err)
	}
	items := env.Items(t, env.Store.AuditTable)
	if len(items) != 1 {
		t.Fatalf("%d audit items", len(items))
	}
	for name, want := range map[string]string{"via": "schedule", "eventId": "ev-7"} {
		got, _ := items[0][name].(*types.AttributeValueMemberS)
		if got == nil || got.Value != want {
			t.Errorf("audit attribute %s = %v, want %q", name, items[0][name], want)
		}
	}
}
