package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// The command migrates a table on the emulator: a dry run reports and writes nothing, a run
// moves the first layout's terminated VM, and flags are checked before anything is read.
func TestCommand(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	if err := env.Store.Put(ctx, dynamo.Seed{Nodes: []capacity.Node{{ID: "n1", UnitIDs: []string{"u0"}, Version: 1}}}); err != nil {
		t.Fatal(err)
	}
	vm, err := attributevalue.MarshalMap(capacity.VM{ID: "v1", NodeID: "n1", State: capacity.VMTerminated, ReclaimID: "rcl_1", UpdatedAt: t0, Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	vm["pk"], vm["sk"], vm["type"] = &types.AttributeValueMemberS{Value: "NODE#n1"}, &types.AttributeValueMemberS{Value: "VM#v1"}, &types.AttributeValueMemberS{Value: "vm"}
	if _, err := env.Plain.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(env.Store.Table), Item: vm}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client := func() (*dynamodb.Client, error) { return env.Client, nil }
	tests := []struct {
		name    string
		args    []string
		wantErr bool
		moved   int
	}{
		{"no table", []string{"-dry-run"}, true, 0},
		{"retention under 90 days", []string{"-table", env.Store.Table, "-retention", "24h"}, true, 0},
		{"dry run", []string{"-table", env.Store.Table, "-dry-run"}, false, 1},
		{"run", []string{"-table", env.Store.Table}, false, 1},
		{"again", []string{"-table", env.Store.Table}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(ctx, tt.args, &out, quiet, client)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			var rep dynamo.MigrationReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("report %q: %v", out.String(), err)
			}
			if rep.TerminatedVMs != tt.moved {
				t.Errorf("report %+v, want %d terminated VM moved", rep, tt.moved)
			}
		})
	}
	for _, it := range env.Items(t, env.Store.Table) {
		if s := it["pk"].(*types.AttributeValueMemberS).Value; it["sk"].(*types.AttributeValueMemberS).Value == "VM#v1" && s != "NODE#n1#HIST" {
			t.Errorf("VM still at %s", s)
		}
	}
}

// TestReportOperatorKeys: the report names the live operator keys without an operator
// permission (issued before they existed), not the migrated, tenant, revoked or expired
// ones, and changes nothing in the keys table.
func TestReportOperatorKeys(t *testing.T) {
	env := dynamotest.New(t)
	ctx := context.Background()
	past := time.Now().Add(-time.Hour)
	old := []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}
	keys := []capacity.APIKey{
		{KeyID: "key-legacy-op", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("k1")), OrgID: "platform", Operator: true, Permissions: old},
		{KeyID: "key-new-op", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("k2")), OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions},
		{KeyID: "key-tenant", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("k3")), OrgID: "acme", Permissions: old},
		{KeyID: "key-revoked-op", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("k4")), OrgID: "platform", Operator: true, Permissions: old, Revoked: true},
		{KeyID: "key-expired-op", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("k5")), OrgID: "platform", Operator: true, Permissions: old, ExpiresAt: &past},
	}
	if err := env.Store.Put(ctx, dynamo.Seed{Keys: keys}); err != nil {
		t.Fatal(err)
	}
	before := env.Items(t, env.Store.KeysTable)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	client := func() (*dynamodb.Client, error) { return env.Client, nil }
	if err := run(ctx, []string{"-report-operator-keys"}, io.Discard, quiet, client); err == nil {
		t.Error("no -keys-table: want an error")
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"-report-operator-keys", "-keys-table", env.Store.KeysTable}, &out, quiet, client); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Keys []struct {
			KeyID string `json:"keyId"`
		} `json:"operatorKeysWithoutOperatorPermission"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	if len(rep.Keys) != 1 || rep.Keys[0].KeyID != "key-legacy-op" {
		t.Errorf("report %s, want key-legacy-op only", out.String())
	}
	if after := env.Items(t, env.Store.KeysTable); !reflect.DeepEqual(after, before) {
		t.Errorf("the report changed the keys table")
	}
}
