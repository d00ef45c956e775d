package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// chain builds n chained records of node-1.
func chain(n int) (capacity.AuditHead, []wire.AuditRecordJSON) {
	var head capacity.AuditHead
	var out []wire.AuditRecordJSON
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		r := capacity.AuditRecord{ID: fmt.Sprintf("rec-%d", i+1), Time: start.Add(time.Duration(i) * time.Second), Action: "reclaim",
			NodeID: "node-1", ReservationID: "res-1", UnitIDs: []string{"gpu-2"}, CallerOrgID: "org-owner", Via: "http"}
		r, head = capacity.ChainAuditRecord(r, head)
		out = append(out, wire.AuditRecord(r))
	}
	return head, out
}

// chainAPI is a chain as the API serves it: its records in pages of at most 2, under head;
// a read of one record (audit verify reading the head again) answers later, if set. It
// serves keys as the key list.
type chainAPI struct {
	head, later *capacity.AuditHead
	records     []wire.AuditRecordJSON
	keys        []wire.KeyJSON
	// calls, if set, is the node's calls chain (served for chain=calls).
	calls *chainAPI
}

func auditAPI(t *testing.T, head capacity.AuditHead, records []wire.AuditRecordJSON) *httptest.Server {
	return (&chainAPI{head: &head, records: records}).serve(t)
}

func (c *chainAPI) serve(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dev/v1/keys" {
			_ = json.NewEncoder(w).Encode(wire.KeyPageJSON{Keys: append([]wire.KeyJSON{}, c.keys...)})
			return
		}
		if r.URL.Path != "/dev/v1/nodes/node-1/audit" && r.URL.Path != "/dev/v1/keys/audit" {
			w.WriteHeader(404)
			return
		}
		c := c
		if r.URL.Query().Get("chain") == "calls" && c.calls != nil {
			c = c.calls
		}
		head := *c.head
		switch r.URL.Query().Get("limit") {
		case "100":
		case "1":
			if c.later != nil {
				head = *c.later
			}
		default:
			t.Errorf("limit %q, want 100 (or 1 for the head)", r.URL.Query().Get("limit"))
		}
		from := 0
		if cur := r.URL.Query().Get("cursor"); cur != "" {
			_, _ = fmt.Sscanf(cur, "p%d", &from)
		}
		to := min(from+2, len(c.records))
		page := wire.AuditChainPageJSON{Head: wire.AuditHead(head), Records: c.records[from:to]}
		if to < len(c.records) {
			page.NextCursor = fmt.Sprintf("p%d", to)
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
}

func TestAuditVerify(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(head *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON
		args   []string
		code   int
		stdout []string
	}{
		{"intact, over three pages", nil, nil, 0, []string{"OK: audit chain of node node-1 verified: 5 records checked, 0 unchained, head seq 5"}},
		{"the key chain", nil, []string{"--keys"}, 0, []string{"OK: audit chain of keys verified: 5 records checked"}},
		{"altered", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			rs[2].Reason = "nothing to see"
			return rs
		}, nil, 1, []string{"FAILED: audit chain of node node-1: altered", "record seq 3 id rec-3 (time 2026-01-01T00:00:02Z, action reclaim)"}},
		{"removed", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			return append(rs[:1:1], rs[3:]...)
		}, nil, 1, []string{"removed", "record seq 4 id rec-4", "missing seq 2..3"}},
		{"inserted", func(_ *capacity.AuditHead, rs []wire.AuditRecordJSON) []wire.AuditRecordJSON {
			fake := rs[1]
			fake.ID, fake.Reason = "rec-x", "forged"
			return append(rs[:2:2], append([]wire.AuditRecordJSON{fake}, rs[2:]...)...)
		}, nil, 1, []string{"inserted", "id rec-x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head, rs := chain(5)
			if tt.edit != nil {
				rs = tt.edit(&head, rs)
			}
			api := auditAPI(t, head, rs)
			defer api.Close()
			args := tt.args
			if args == nil {
				args = []string{"--node", "node-1"}
			}
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify"}, args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

// A node's verify reads and verifies both its chains, the changes then the calls, and fails
// on either.
func TestAuditVerifyBothNodeChains(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(rs []wire.AuditRecordJSON)
		args   []string
		code   int
		stdout []string
	}{
		{"both intact", nil, nil, 0, []string{
			"OK: audit chain of node node-1 verified: 5 records checked",
			"OK: audit chain of node node-1 calls verified: 3 records checked, 0 unchained, head seq 3"}},
		{"both intact, as JSON", nil, []string{"--output", "json"}, 0, []string{`"chain": "node node-1"`, `"calls": {`, `"chain": "node node-1 calls"`, `"checked": 3`}},
		{"a calls record altered", func(rs []wire.AuditRecordJSON) { rs[1].Outcome = "ok" }, nil, 1, []string{
			"OK: audit chain of node node-1 verified: 5 records checked",
			"FAILED: audit chain of node node-1 calls: altered", "record seq 2 id rec-2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head, rs := chain(5)
			callsHead, calls := chain(3)
			if tt.edit != nil {
				tt.edit(calls)
			}
			api := (&chainAPI{head: &head, records: rs, calls: &chainAPI{head: &callsHead, records: calls}}).serve(t)
			defer api.Close()
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify", "--node", "node-1"}, tt.args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

// Each tampering that verification used to pass now fails it: a head moved back (records
// past it skipped unchecked), an unchained record planted before the chain (as if written
// before chains existed), and a key whose grants were changed in place. The same chains
// untampered pass, with what the chain cannot vouch for said aloud.
func TestAuditVerifyTamperings(t *testing.T) {
	legacy := capacity.AuditRecord{ID: "old", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), NodeID: "node-1", Action: "release"}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	exp := at.AddDate(1, 0, 0)
	key := capacity.APIKey{KeyID: "key-1", OrgID: "acme", Permissions: []string{capacity.PermRead}, ExpiresAt: &exp, CreatedAt: at}
	// keyChain is the key-management chain of key-1's creation, its start pinned empty.
	keyChain := func() (capacity.AuditHead, []wire.AuditRecordJSON) {
		g := capacity.GrantsOf(key)
		rec, head := capacity.ChainAuditRecord(capacity.AuditRecord{ID: "k1", Time: at, Action: capacity.ActionKeyCreate,
			TargetKeyID: key.KeyID, ActingFor: key.OrgID, Outcome: "ok", Grants: &g}, capacity.AuditHead{})
		head.Start = capacity.ChainStartOf(nil)
		return head, []wire.AuditRecordJSON{wire.AuditRecord(rec)}
	}
	// nodeChain is node-1's chain of 5 records after one legacy record, its start pinned.
	nodeChain := func() (capacity.AuditHead, []wire.AuditRecordJSON) {
		head, rs := chain(5)
		head.Start = capacity.ChainStartOf([]capacity.AuditRecord{legacy})
		return head, append([]wire.AuditRecordJSON{wire.AuditRecord(legacy)}, rs...)
	}
	headAt := func(rs []wire.AuditRecordJSON, seq int64, start capacity.ChainStart) *capacity.AuditHead {
		for _, r := range rs {
			if r.Seq == seq {
				return &capacity.AuditHead{Seq: seq, Hash: r.Hash, Start: start}
			}
		}
		t.Fatalf("no record %d", seq)
		return nil
	}
	tests := []struct {
		name   string
		keys   bool
		setup  func(c *chainAPI)
		code   int
		stdout []string
	}{
		{"node chain untouched", false, func(c *chainAPI) {}, 0, []string{"OK: audit chain of node node-1 verified: 5 records checked, 1 unchained"}},
		{"records appended while verifying", false, func(c *chainAPI) {
			c.later, c.head = c.head, headAt(c.records, 3, c.head.Start)
		}, 0, []string{"verified: 3 records checked", "2 records appended while verifying (seq 4 to 5)"}},
		{"head rolled back", false, func(c *chainAPI) {
			c.head = headAt(c.records, 3, c.head.Start)
		}, 1, []string{"FAILED: audit chain of node node-1: beyond the head", "at record seq 4 id -", "head read after them is at seq 3"}},
		{"head rolled back and a record past it rewritten", false, func(c *chainAPI) {
			c.head = headAt(c.records, 3, c.head.Start)
			c.records[5].Reason = "nothing happened"
		}, 1, []string{"FAILED: audit chain of node node-1: altered", "record seq 5 id rec-5"}},
		{"back-dated unchained record planted", false, func(c *chainAPI) {
			planted := legacy
			planted.ID, planted.Time, planted.Reason = "planted", legacy.Time.Add(-time.Hour), "approved"
			c.records = append([]wire.AuditRecordJSON{wire.AuditRecord(planted)}, c.records...)
		}, 1, []string{"FAILED: audit chain of node node-1: inserted", "before the chain", "2 unchained records precede the chain; its start pins 1"}},
		{"legacy record rewritten", false, func(c *chainAPI) {
			c.records[0].Reason = "rewritten"
		}, 1, []string{"FAILED: audit chain of node node-1: altered", "before the chain"}},
		{"an unpinned start is said aloud", false, func(c *chainAPI) {
			c.head.Start = capacity.ChainStart{}
		}, 0, []string{"OK: audit chain of node node-1", "WARNING: the chain's start is not pinned", "1 unchained records are legacy"}},
		{"keys untouched", true, func(c *chainAPI) {}, 0, []string{"OK: audit chain of keys verified: 1 records checked", "1 keys grant what their records say"}},
		{"key made operator in place", true, func(c *chainAPI) {
			c.keys[0].Operator = true
		}, 1, []string{"FAILED: audit chain of keys: key key-1 altered", "record seq 1 id k1", "the key grants org acme, permissions [reservation.read], operator true"}},
		{"key's expiry extended in place", true, func(c *chainAPI) {
			c.keys[0].ExpiresAt = exp.AddDate(5, 0, 0).Format(time.RFC3339)
		}, 1, []string{"FAILED: audit chain of keys: key key-1 altered", "expires 2032"}},
		{"key planted without a record", true, func(c *chainAPI) {
			c.keys = append(c.keys, wire.Key(capacity.APIKey{KeyID: "key-x", OrgID: "acme", Operator: true}))
		}, 0, []string{"OK: audit chain of keys", "WARNING: key key-x: no record in the chain"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &chainAPI{}
			var head capacity.AuditHead
			args := []string{"--node", "node-1"}
			if tt.keys {
				head, c.records = keyChain()
				c.keys = []wire.KeyJSON{wire.Key(key)}
				args = []string{"--keys"}
			} else {
				head, c.records = nodeChain()
			}
			c.head = &head
			tt.setup(c)
			api := c.serve(t)
			defer api.Close()
			got := runCLI(t, api, "", nil, append([]string{"audit", "verify"}, args...)...)
			if got.code != tt.code {
				t.Fatalf("exit %d, want %d\n%s\n%s", got.code, tt.code, got.stdout, got.err)
			}
			assertInOrder(t, "stdout", got.stdout, tt.stdout)
		})
	}
}

func TestAuditVerifyJSON(t *testing.T) {
	head, rs := chain(3)
	rs[1].Action = "release"
	api := auditAPI(t, head, rs)
	defer api.Close()
	got := runCLI(t, api, "", nil, "audit", "verify", "--node", "node-1", "--output", "json")
	if got.code != 1 {
		t.Fatalf("exit %d: %s", got.code, got.err)
	}
	var v verifyResult
	if err := json.Unmarshal([]byte(got.stdout), &v); err != nil {
		t.Fatalf("%v: %s", err, got.stdout)
	}
	if v.OK || v.Problem != "altered" || v.Seq != 2 || v.RecordID != "rec-2" || v.Record == nil || v.Record.Action != "release" {
		t.Errorf("report %+v", v)
	}
}

// TestAuditListTables: the key chain's table names the key each record created or revoked;
// a node's keeps its reservation columns.
func TestAuditListTables(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var head capacity.AuditHead
	var keyRecs []wire.AuditRecordJSON
	for _, r := range []capacity.AuditRecord{
		{ID: "a1", Time: at, Action: capacity.ActionKeyCreate, Via: "http", CallerOrgID: "org-platform", ActorKeyID: "key-op", TargetKeyID: "key-new", Outcome: "ok"},
		{ID: "a2", Time: at.Add(time.Second), Action: capacity.ActionKeyRevoke, Via: "http", CallerOrgID: "org-platform", ActorKeyID: "key-op", TargetKeyID: "key-old", Outcome: "ok", Reason: "leaked"},
	} {
		var rec capacity.AuditRecord
		rec, head = capacity.ChainAuditRecord(r, head)
		keyRecs = append(keyRecs, wire.AuditRecord(rec))
	}
	nodeHead, nodeRecs := chain(1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page := wire.AuditChainPageJSON{Head: wire.AuditHead(head), Records: keyRecs}
		if r.URL.Path == "/dev/v1/nodes/node-1/audit" {
			page = wire.AuditChainPageJSON{Head: wire.AuditHead(nodeHead), Records: nodeRecs}
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	defer api.Close()
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"keys", []string{"--keys"}, []string{
			"SEQ  TIME                  ACTION      VIA   ORG           KEY     TARGET KEY  OUTCOME  REASON",
			"1    2026-01-01T00:00:00Z  key.create  http  org-platform  key-op  key-new     ok       -",
			"2    2026-01-01T00:00:01Z  key.revoke  http  org-platform  key-op  key-old     ok       leaked",
		}},
		{"node", []string{"--node", "node-1"}, []string{
			"SEQ  TIME                  ACTION   VIA   ORG        KEY  RESERVATION  UNITS  DRY RUN  OUTCOME  REASON",
			"1    2026-01-01T00:00:00Z  reclaim  http  org-owner  -    res-1        gpu-2  false    -        -",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runCLI(t, api, "", nil, append([]string{"audit", "list"}, tt.args...)...)
			if got.code != 0 {
				t.Fatalf("exit %d: %s", got.code, got.err)
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSuffix(got.stdout, "\n"), "\n")[2:] {
				lines = append(lines, strings.TrimRight(l, " "))
			}
			if strings.Join(lines, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("stdout\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
