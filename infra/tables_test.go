package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/table"
)

func TestTables(t *testing.T) {
	for _, tc := range []struct {
		env      string
		deletion string // DeletionPolicy and UpdateReplacePolicy
		pitr     bool
	}{
		{"local", "Delete", false},
		{"dev", "Delete", false},
		{"prod", "Retain", true},
		{"staging", "Retain", true},
	} {
		for _, spec := range stackTables {
			t.Run(tc.env+"/"+spec.Suffix, func(t *testing.T) {
				tp := synth(t, tc.env)
				name := "capacity-" + tc.env + "-" + spec.Suffix
				if name != spec.Name(tc.env) {
					t.Fatalf("table.Name(%q) = %q, want %q", tc.env, spec.Name(tc.env), name)
				}
				id, r := tp.one(t, "AWS::DynamoDB::Table", "TableName", name)
				p := props(r)
				if !strings.HasPrefix(id, spec.LogicalID) {
					t.Errorf("logical id %s, want prefix %s", id, spec.LogicalID)
				}
				if p["BillingMode"] != "PAY_PER_REQUEST" {
					t.Errorf("BillingMode %v", p["BillingMode"])
				}
				wantKeys := []any{
					map[string]any{"AttributeName": "pk", "KeyType": "HASH"},
					map[string]any{"AttributeName": "sk", "KeyType": "RANGE"},
				}
				if !reflect.DeepEqual(p["KeySchema"], wantKeys) {
					t.Errorf("KeySchema %s", toJSON(p["KeySchema"]))
				}
				// Every key attribute (table and indexes) is a string.
				wantAttrs := map[string]string{table.PartitionKey: "S", table.SortKey: "S"}
				for _, ix := range spec.Indexes {
					wantAttrs[ix.PartitionKey], wantAttrs[ix.SortKey] = "S", "S"
				}
				gotAttrs := map[string]string{}
				for _, a := range asList(p["AttributeDefinitions"]) {
					a := a.(map[string]any)
					gotAttrs[a["AttributeName"].(string)] = a["AttributeType"].(string)
				}
				if !reflect.DeepEqual(gotAttrs, wantAttrs) {
					t.Errorf("AttributeDefinitions %v, want %v", gotAttrs, wantAttrs)
				}
				// Indexes: exactly those of shared/table, projection ALL but for the audit's
				// byReservation (its keys only: the trail reads the records by key).
				var wantGSIs []any
				for _, ix := range spec.Indexes {
					projection := "ALL"
					if spec.LogicalID == table.Audit.LogicalID && ix.Name == table.AuditByReservationIndex {
						projection = "KEYS_ONLY"
					}
					wantGSIs = append(wantGSIs, map[string]any{
						"IndexName": ix.Name,
						"KeySchema": []any{
							map[string]any{"AttributeName": ix.PartitionKey, "KeyType": "HASH"},
							map[string]any{"AttributeName": ix.SortKey, "KeyType": "RANGE"},
						},
						"Projection": map[string]any{"ProjectionType": projection},
					})
				}
				gotGSIs, _ := p["GlobalSecondaryIndexes"].([]any)
				if !reflect.DeepEqual(gotGSIs, wantGSIs) {
					t.Errorf("GlobalSecondaryIndexes %s, want %s", toJSON(gotGSIs), toJSON(wantGSIs))
				}
				// The audit table is stored far more than it is read: Standard-IA; every other
				// table, Standard (CDK writes it out).
				wantClass := "STANDARD"
				if spec.LogicalID == table.Audit.LogicalID {
					wantClass = "STANDARD_INFREQUENT_ACCESS"
				}
				if p["TableClass"] != wantClass {
					t.Errorf("TableClass %v, want %s", p["TableClass"], wantClass)
				}
				var wantTTL any
				if spec.TTL {
					wantTTL = map[string]any{"AttributeName": table.TTLAttribute, "Enabled": true}
				}
				if !reflect.DeepEqual(p["TimeToLiveSpecification"], wantTTL) {
					t.Errorf("TimeToLiveSpecification %s, want %s", toJSON(p["TimeToLiveSpecification"]), toJSON(wantTTL))
				}
				pitr := false
				if spec, ok := p["PointInTimeRecoverySpecification"].(map[string]any); ok {
					pitr = spec["PointInTimeRecoveryEnabled"] == true
				}
				if pitr != tc.pitr {
					t.Errorf("PITR %v, want %v", pitr, tc.pitr)
				}
				if got := p["DeletionProtectionEnabled"] == true; got != tc.pitr {
					t.Errorf("DeletionProtectionEnabled %v, want %v", got, tc.pitr)
				}
				if r["DeletionPolicy"] != tc.deletion || r["UpdateReplacePolicy"] != tc.deletion {
					t.Errorf("DeletionPolicy %v UpdateReplacePolicy %v, want %s", r["DeletionPolicy"], r["UpdateReplacePolicy"], tc.deletion)
				}
			})
		}
	}
}

// The literal contract with shared/table, in case it changes under us.
func TestStateTableHasByStateIndex(t *testing.T) {
	tp := synth(t, "local")
	_, r := tp.one(t, "AWS::DynamoDB::Table", "TableName", "capacity-local-state")
	gsis := toJSON(props(r)["GlobalSecondaryIndexes"])
	for _, s := range []string{`"IndexName":"byState"`, `"gsi1pk"`, `"gsi1sk"`, `"IndexName":"byList"`, `"gsi2pk"`, `"gsi2sk"`} {
		if !strings.Contains(gsis, s) {
			t.Errorf("state table indexes %s lack %s", gsis, s)
		}
	}
	if n := len(tp.resources("AWS::DynamoDB::Table")); n != 4 {
		t.Errorf("want 4 tables (state, audit, keys, limits), got %d", n)
	}
}

func tableID(t *testing.T, tp tmpl, spec table.Table, env string) string {
	id, _ := tp.one(t, "AWS::DynamoDB::Table", "TableName", spec.Name(env))
	return id
}
