package config

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/openrelay/capacity/shared/config/envvar"
)

// TestReadStore: every function reads the state store's variables through one reader, which
// reads the tables (and the history retention) its function declares and no others, and the
// store it opens carries them.
func TestReadStore(t *testing.T) {
	every := []string{"STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k", "LIMITS_TABLE=l", "HISTORY_RETENTION=48h"}
	for _, tc := range []struct {
		name    string
		fn      envvar.Function
		environ []string
		want    Store
		wantErr string
	}{
		{"every table", envvar.API, every, Store{StateTable: "s", AuditTable: "a", KeysTable: "k", LimitsTable: "l", HistoryRetention: 48 * time.Hour}, ""},
		{"retention unset: the store's default", envvar.API, every[:4], Store{StateTable: "s", AuditTable: "a", KeysTable: "k", LimitsTable: "l"}, ""},
		{"the state table alone", envvar.OperationEvents, every[:1], Store{StateTable: "s"}, ""},
		{"the state table and retention", envvar.Reconciler, []string{"STATE_TABLE=s", "HISTORY_RETENTION=1h"}, Store{StateTable: "s", HistoryRetention: time.Hour}, ""},
		{"no limits table", envvar.ReclaimEvents, []string{"STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k"}, Store{StateTable: "s", AuditTable: "a", KeysTable: "k"}, ""},
		{"a table the function does not declare", envvar.OperationEvents, every[:2], Store{StateTable: "s"}, "AUDIT_TABLE is not one of operation-events's"},
		{"a declared table unset", envvar.API, []string{"STATE_TABLE=s", "AUDIT_TABLE=a", "KEYS_TABLE=k"}, Store{StateTable: "s", AuditTable: "a", KeysTable: "k"}, "LIMITS_TABLE must be set"},
		{"no state table", envvar.TerminateNode, nil, Store{}, "STATE_TABLE must be set"},
		{"bad retention", envvar.TerminateNode, []string{"STATE_TABLE=s", "HISTORY_RETENTION=90 days"}, Store{StateTable: "s"}, "HISTORY_RETENTION"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := envvar.New(tc.fn, tc.environ)
			got := ReadStore(e)
			if got != tc.want {
				t.Errorf("ReadStore = %+v, want %+v", got, tc.want)
			}
			// Only the store's variables are read here: the function's others show as unread.
			err := e.Err()
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && err != nil {
				for _, line := range strings.Split(err.Error(), "\n") {
					if !strings.Contains(line, "but does not read it") {
						t.Fatalf("error %q", line)
					}
				}
			}
			store := got.Open(aws.Config{Region: "us-east-1"})
			if store.Table != got.StateTable || store.AuditTable != got.AuditTable || store.KeysTable != got.KeysTable ||
				store.LimitsTable != got.LimitsTable || store.Retention != got.HistoryRetention {
				t.Errorf("Open = %+v, want the tables and retention of %+v", store, got)
			}
		})
	}
}

// TestBus: a function without a bus name has no publisher (a nil interface, which the domain
// takes as none), with one it publishes there.
func TestBus(t *testing.T) {
	if p := Bus(aws.Config{}, ""); p != nil {
		t.Errorf("Bus(\"\") = %#v, want nil", p)
	}
	if p := Bus(aws.Config{}, "capacity-test"); p == nil {
		t.Error("Bus(capacity-test) = nil")
	}
}
