package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/wire"
)

// What the API answers is shown, never obeyed: a reason, description or problem detail
// carrying terminal sequences, bidirectional overrides or line breaks (stored before the API
// refused them, or sent by a tampered endpoint) is printed escaped, in tables, in JSON and in
// errors, and a value cannot forge a row of the table it is in.
func TestOutputEscapesControlCharacters(t *testing.T) {
	evil := "ok\x1b[2J\x1b]0;pwned\x07\u009b31m\u202eevil\rX\n9    2026-01-01T00:00:00Z  key.create  forged\tcol"
	keys := wire.KeyPageJSON{Keys: []wire.KeyJSON{{KeyID: "key-1", OrgID: "org-a", Permissions: []string{"reservation.read"},
		CreatedAt: "2026-01-01T00:00:00Z", Description: evil}}}
	records := wire.AuditChainPageJSON{Records: []wire.AuditRecordJSON{{Seq: 1, Time: "2026-01-01T00:00:00Z", Action: "key.revoke",
		Via: "http", Outcome: "ok", Reason: evil}}}
	reclaims := wire.ReclaimPageJSON{Reclaims: []wire.OperationJSON{{ID: "op-1", NodeID: "node-1", ReservationID: "res-1", State: "failed",
		UnitIDs: []string{"gpu-1"}, Reason: evil, CreatedAt: "2026-01-01T00:00:00Z"}}}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/dev/v1/keys":
			_ = json.NewEncoder(w).Encode(keys)
		case "/dev/v1/keys/audit":
			_ = json.NewEncoder(w).Encode(records)
		case "/dev/v1/nodes/node-1/reservations/res-1/reclaims":
			_ = json.NewEncoder(w).Encode(reclaims)
		default:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"status":404,"code":"not_found","detail":"gone\u001b[31m\u202e"}`)
		}
	}))
	defer api.Close()
	tests := []struct {
		name  string
		args  []string
		code  int
		lines int // lines of stdout: the header and one row, not a forged second
	}{
		{"keys table", []string{"keys", "list"}, 0, 2},
		{"audit table", []string{"audit", "list", "--keys"}, 0, 4},
		{"reclaims table", []string{"reclaims", "list", "--node", "node-1", "--reservation", "res-1"}, 0, 4},
		{"keys json", []string{"--output", "json", "keys", "list"}, 0, -1},
		{"problem", []string{"nodes", "get", "--node", "node-1"}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := runCLI(t, api, "", nil, tt.args...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d: %s", got.code, tt.code, got.err)
			}
			for name, text := range map[string]string{"stdout": got.stdout, "stderr": got.err} {
				if i := strings.IndexFunc(text, func(r rune) bool {
					return r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x202e)
				}); i >= 0 {
					t.Errorf("%s holds %q unescaped: %q", name, text[i:i+1], text)
				}
			}
			switch {
			case tt.lines > 0:
				if n := strings.Count(strings.TrimSuffix(got.stdout, "\n"), "\n") + 1; n != tt.lines {
					t.Errorf("stdout has %d lines, want %d:\n%s", n, tt.lines, got.stdout)
				}
				if !strings.Contains(got.stdout, `ok\u001b[2J`) || !strings.Contains(got.stdout, `\n9    2026`) {
					t.Errorf("the value is not shown escaped:\n%s", got.stdout)
				}
			case tt.lines < 0:
				var back wire.KeyPageJSON
				if err := json.Unmarshal([]byte(got.stdout), &back); err != nil || len(back.Keys) != 1 || back.Keys[0].Description != evil {
					t.Errorf("json output no longer decodes to what the API said (%v): %s", err, got.stdout)
				}
			default:
				if !strings.Contains(got.err, `gone\u001b[31m\u202e`) {
					t.Errorf("stderr %q", got.err)
				}
			}
		})
	}
}
