package dynamo_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// Nodes, reservations and operations written before the list index existed get their entries
// from the migration: a dry run counts them and writes nothing, the run writes them (the lists
// then find them), a re-run finds nothing left.
func TestMigrateBackfillsTheLists(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(4, 0))
	// As a table from before the index: no directory or membership entries...
	for _, it := range env.Items(t, env.Store.Table) {
		if sk := str(it["sk"]); sk == "DIR" || strings.HasPrefix(sk, "MEMBER#") {
			if _, err := env.Plain.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(env.Store.Table),
				Key: map[string]types.AttributeValue{"pk": it["pk"], "sk": it["sk"]}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// ...and an operation without its list keys.
	old := capacity.Operation{ID: "rcl_old", NodeID: "n1", ReservationID: "r1", State: capacity.OpCompleted, VMIDs: []string{"vm-t"},
		UnitIDs: []string{"u3"}, CreatedAt: t0, UpdatedAt: t0, Attempt: 1}
	firstLayout(t, env, "NODE#n1#OP#rcl_old", "OP", "operation", map[string]any{"gsi1pk": "OPSTATE#completed", "gsi1sk": t0.Format(time.RFC3339Nano) + "#rcl_old"}, old)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	listed := func() (nodes, members, ops []string) {
		t.Helper()
		ns, _, err := env.Store.DirectoryNodes(ctx, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			nodes = append(nodes, n.ID+":"+n.OwnerOrgID)
		}
		for _, org := range []string{"owner", "aud", "mgr"} {
			ids, _, err := env.Store.MemberNodeIDs(ctx, org, "", 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				members = append(members, org+":"+id)
			}
		}
		os, _, err := env.Store.ReservationOperations(ctx, "n1", "r1", nil, nil, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range os {
			ops = append(ops, o.ID)
		}
		return nodes, members, ops
	}
	if n, m, o := listed(); len(n)+len(m)+len(o) != 0 {
		t.Fatalf("listed before the migration: %v %v %v", n, m, o)
	}

	before := env.Items(t, env.Store.Table)
	rep, err := env.Store.Migrate(ctx, true, quiet)
	if err != nil {
		t.Fatal(err)
	}
	// The node's directory entry (with its owner's membership), aud's and mgr's memberships.
	if rep.ListEntries != 3 || rep.ListedOperations != 1 {
		t.Errorf("dry run = %+v, want 3 list entries and 1 operation", rep)
	}
	if len(env.Items(t, env.Store.Table)) != len(before) {
		t.Fatal("the dry run wrote")
	}
	if rep, err = env.Store.Migrate(ctx, false, quiet); err != nil || rep.ListEntries != 3 || rep.ListedOperations != 1 {
		t.Errorf("run = %+v, %v", rep, err)
	}
	nodes, members, ops := listed()
	if !slices.Equal(nodes, []string{"n1:owner"}) || !slices.Equal(members, []string{"owner:n1", "aud:n1", "mgr:n1"}) || !slices.Equal(ops, []string{"rcl_old"}) {
		t.Errorf("listed after the migration: %v %v %v", nodes, members, ops)
	}
	if rep, err = env.Store.Migrate(ctx, false, quiet); err != nil || rep.ListEntries+rep.ListedOperations != 0 {
		t.Errorf("re-run = %+v, %v: want nothing left", rep, err)
	}
}
