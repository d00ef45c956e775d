package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// ctl runs the capacityctl binary against the stack.
type ctl struct {
	t       *testing.T
	bin     string
	outputs string // the stack outputs file it reads the API and the tables from
}

type ctlResult struct {
	code           int
	stdout, stderr string
}

// newCtl builds capacityctl and writes the stack's outputs where it reads them.
func newCtl(t *testing.T) *ctl {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "capacityctl")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", bin, "./cmd/capacityctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build capacityctl: %v\n%s", err, out)
	}
	path := os.Getenv("CAPACITY_OUTPUTS")
	if path == "" {
		path = filepath.Join(dir, "outputs.json")
		if err := stack.WriteOutputsFile(path, "capacity-local", outputs); err != nil {
			t.Fatal(err)
		}
	}
	return &ctl{t: t, bin: bin, outputs: path}
}

// run runs capacityctl with key (none if "") and args, stdin as its input. Its environment
// holds no CAPACITY_* or AWS_* variable: it finds everything from the outputs file.
func (c *ctl) run(key, stdin string, args ...string) ctlResult {
	c.t.Helper()
	full := append([]string{"--outputs", c.outputs}, args...)
	if key != "" {
		full = append([]string{"--key", key}, full...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, full...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.t.TempDir()}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("capacityctl %v: %v", args, err)
	}
	return ctlResult{code, out.String(), errOut.String()}
}

// ok runs capacityctl and fails the test unless it exits 0.
func (c *ctl) ok(key string, args ...string) ctlResult {
	c.t.Helper()
	r := c.run(key, "", args...)
	if r.code != 0 {
		c.t.Fatalf("capacityctl %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

// json runs capacityctl with --output json and decodes its answer into v.
func (c *ctl) json(key string, v any, args ...string) {
	c.t.Helper()
	r := c.ok(key, append(args, "--output", "json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		c.t.Fatalf("capacityctl %v: stdout is not one JSON document: %v\n%s", args, err, r.stdout)
	}
}

// TestOperatingFromNothing drives capacityctl through the life of a new environment: the
// first operator key, a tenant's key, a node, a reservation, a topology change and its
// review, a spot VM, a reclaim followed to its end, and the audit trail verified, then
// tampered with and caught.
func TestOperatingFromNothing(t *testing.T) {
	if faultSpec != "" {
		t.Skip("exact answers: not under injected faults")
	}
	c := newCtl(t)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	node, tenant := "node-op-"+suffix, "org-tenant-"+suffix

	// 1. The first operator key, created with AWS credentials on the tables themselves (no key
	// exists yet to call the API with), audited on the keys' chain as "direct".
	var boot struct {
		Key    struct{ KeyID string } `json:"key"`
		Secret string                 `json:"secret"`
	}
	c.json("", &boot, "keys", "create", "--bootstrap", "--org", "org-platform", "--description", "first operator key")
	if !strings.HasPrefix(boot.Secret, "ocap_") || boot.Key.KeyID == "" {
		t.Fatalf("bootstrap answer: %+v", boot)
	}
	op := boot.Secret

	// 2. A tenant's key, through the API; its secret is shown once.
	var tk struct {
		Key struct {
			KeyID       string   `json:"keyId"`
			OrgID       string   `json:"orgId"`
			Permissions []string `json:"permissions"`
		} `json:"key"`
		Secret string `json:"secret"`
	}
	c.json(op, &tk, "keys", "create", "--org", tenant, "--permissions", "reservation.capacity,reservation.read", "--description", "tenant")
	if tk.Key.OrgID != tenant || !strings.HasPrefix(tk.Secret, "ocap_") {
		t.Fatalf("tenant key: %+v", tk)
	}
	tenantKey := tk.Secret
	if r := c.ok(op, "keys", "list", "--limit", "100"); !strings.Contains(r.stdout, "KEY ID") {
		t.Errorf("keys list:\n%s", r.stdout)
	}
	// The operator key's use is recorded off the request path, within a moment.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var page wire.KeyPageJSON
		c.json(op, &page, "keys", "list", "--limit", "100")
		used := ""
		for _, k := range page.Keys {
			if k.KeyID == boot.Key.KeyID {
				used = k.LastUsedAt
			}
		}
		if used != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator key %s has no lastUsedAt after being used: %+v", boot.Key.KeyID, page.Keys)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A tenant is not an operator: the key routes do not exist for it.
	if r := c.run(tenantKey, "", "keys", "list"); r.code != 1 || !strings.Contains(r.stderr, "404 not_found") {
		t.Errorf("keys list as a tenant: exit %d %s", r.code, r.stderr)
	}
	scheduler := narrowOperatorKeys(t, c, op, boot.Key.KeyID)

	// 3. Register the node; its agent key is printed once: a random key, not one derived from
	// the master secret, which the operator installs on the agent.
	var put struct {
		Node     struct{ NodeID string } `json:"node"`
		Created  bool                    `json:"created"`
		AgentKey string                  `json:"agentKey"`
	}
	c.json(op, &put, "nodes", "put", "--node", node, "--owner", tenant, "--units", "gpu-0,gpu-1,gpu-2,gpu-3",
		"--agent-endpoint", agents.Endpoint(node), "--reason", "new node")
	if !put.Created || put.Node.NodeID != node {
		t.Fatalf("nodes put: %+v", put)
	}
	derived, err := agent.NodeKey(masterSecret, node)
	if err != nil {
		t.Fatal(err)
	}
	key, err := base64.StdEncoding.DecodeString(put.AgentKey)
	if err != nil || len(key) != capacity.AgentKeyBytes || bytes.Equal(key, derived) {
		t.Fatalf("agent key %q: want %d random bytes (%v)", put.AgentKey, capacity.AgentKeyBytes, err)
	}
	// Installed alone: the reclaim below terminates only if the service signs with it.
	if err := agents.SetNodeKeys(node, key); err != nil {
		t.Fatal(err)
	}
	if r := c.ok(op, "nodes", "get", "--node", node); !strings.Contains(r.stdout, "gpu-0,gpu-1,gpu-2,gpu-3") {
		t.Errorf("nodes get:\n%s", r.stdout)
	}

	// 4. A reservation of three units for the tenant, and the list.
	var created struct {
		Reservation struct{ ID, Status string } `json:"reservation"`
	}
	c.json(op, &created, "reservations", "create", "--node", node, "--id", "res-op", "--units", "gpu-0,gpu-1,gpu-2",
		"--allowed-orgs", tenant, "--managing-orgs", tenant, "--contract", "contract-1", "--ends", time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339))
	if created.Reservation.ID != "res-op" || created.Reservation.Status != "active" {
		t.Fatalf("reservations create: %+v", created)
	}
	if r := c.ok(tenantKey, "reservations", "list", "--node", node); !strings.Contains(r.stdout, "res-op") || !strings.Contains(r.stdout, "active") {
		t.Errorf("reservations list:\n%s", r.stdout)
	}

	// 5. The topology changes: the reservation needs review and cannot be reclaimed.
	var topo struct {
		Changed     bool     `json:"changed"`
		NeedsReview []string `json:"needsReview"`
	}
	c.json(op, &topo, "topology", "set", "--node", node, "--units", "gpu-0,gpu-1,gpu-2,gpu-3,gpu-4", "--expected-gen", "1", "--reason", "added gpu-4")
	if !topo.Changed || len(topo.NeedsReview) != 1 || topo.NeedsReview[0] != "res-op" {
		t.Fatalf("topology set: %+v", topo)
	}
	// The same change sent again against generation 1 is stale now: refused, nothing moves.
	if r := c.run(op, "", "topology", "set", "--node", node, "--units", "gpu-0,gpu-1", "--expected-gen", "1", "--reason", "late"); r.code != 1 ||
		!strings.Contains(r.stderr, "409 topology_changed") {
		t.Errorf("a stale topology change: exit %d\n%s", r.code, r.stderr)
	}
	if r := c.ok(op, "nodes", "get", "--node", node); !strings.Contains(r.stdout, "gpu-0,gpu-1,gpu-2,gpu-3,gpu-4") {
		t.Errorf("after a stale topology change:\n%s", r.stdout)
	}
	if r := c.ok(tenantKey, "reservations", "get", "--node", node, "--reservation", "res-op"); !strings.Contains(r.stdout, "needs-review") {
		t.Errorf("after the topology change:\n%s", r.stdout)
	}
	// The state is checked before the topology: a needs-review reservation is not active.
	if r := c.run(tenantKey, "", "reclaim", "--node", node, "--reservation", "res-op", "--units", "gpu-1", "--yes"); r.code != 1 ||
		!strings.Contains(r.stderr, "409 reservation_not_active") {
		t.Errorf("reclaim of a reservation under review: exit %d\n%s", r.code, r.stderr)
	}

	// 6. Reaffirm at the node's new topology.
	var reaff struct {
		Reservation struct {
			Status      string `json:"status"`
			TopologyGen int64  `json:"topologyGen"`
		} `json:"reservation"`
	}
	c.json(op, &reaff, "reservations", "reaffirm", "--node", node, "--reservation", "res-op", "--reason", "checked")
	if reaff.Reservation.Status != "active" || reaff.Reservation.TopologyGen != 2 {
		t.Fatalf("reaffirm: %+v", reaff)
	}

	// 7. The tenant releases gpu-1 and the marketplace places a spot VM on it.
	if r := c.ok(tenantKey, "release", "--node", node, "--reservation", "res-op", "--units", "gpu-1", "--reason", "idle"); !strings.Contains(r.stdout, "released to the spot market  gpu-1") {
		t.Errorf("release:\n%s", r.stdout)
	}
	if r := c.ok(scheduler, "vms", "place", "--node", node, "--vm", "vm-op-1", "--org", "org-buyer", "--tier", "spot", "--units", "gpu-1"); !strings.Contains(r.stdout, "vm-op-1") || !strings.Contains(r.stdout, "running") {
		t.Errorf("vms place:\n%s", r.stdout)
	}
	// Nothing tells the agent simulator of vm-op-1: it learns it from the table, as make run's
	// does, so the walk ends "1 terminated" as docs/operating.md says, not "1 already-gone".

	// 8. A dry run changes nothing and names the command that reclaims; then the reclaim with
	// the CLI, with a grace: dry run, confirmation, the real call, and the termination followed
	// to its end, the eviction notice and the countdown told.
	r := c.ok(tenantKey, "reclaim", "--dry-run", "--node", node, "--reservation", "res-op", "--units", "gpu-1", "--reason", "training run")
	if !strings.Contains(r.stdout, "would terminate  vm-op-1") || !strings.Contains(r.stdout, "To reclaim: capacityctl reclaim --node "+node+" --reservation res-op --units gpu-1 --reason 'training run'") {
		t.Errorf("reclaim --dry-run:\n%s", r.stdout)
	}
	if st := agents.State(node, "vm-op-1"); st != "running" {
		t.Errorf("after a dry run the agent has vm-op-1 %s", st)
	}
	r = c.run(tenantKey, "y\n", "reclaim", "--node", node, "--reservation", "res-op", "--units", "gpu-1", "--reason", "training run", "--grace", "2", "--wait", "3m")
	if r.code != 0 {
		t.Fatalf("reclaim: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, s := range []string{"would terminate  vm-op-1", "plan ETag", "reclaim id", "notice delivered to vm-op-1 at ", "grace: ",
		"vm-op-1 terminated at ", "1/1 VMs done: 1 terminated, 0 already-gone, 0 failed"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("reclaim output lacks %q:\n%s", s, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "Proceed? [y/N]") {
		t.Errorf("reclaim did not ask: %s", r.stderr)
	}
	if st := agents.State(node, "vm-op-1"); st != "terminated" {
		t.Errorf("the agent has vm-op-1 %s", st)
	}
	m := regexp.MustCompile(`reclaim id\s+(\S+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no reclaim id in:\n%s", r.stdout)
	}
	reclaim := []string{"--node", node, "--reservation", "res-op", "--reclaim", m[1]}
	if r := c.ok(tenantKey, append([]string{"reclaims", "get"}, reclaim...)...); !regexp.MustCompile(`vm-op-1\s+terminated\s+\S+\s+delivered at `).MatchString(r.stdout) {
		t.Errorf("reclaims get:\n%s", r.stdout)
	}
	if r := c.ok(tenantKey, append([]string{"reclaims", "wait"}, reclaim...)...); !strings.Contains(r.stdout, "1/1 VMs done: 1 terminated") {
		t.Errorf("reclaims wait of an ended reclaim:\n%s", r.stdout)
	}
	if r := c.ok(tenantKey, append([]string{"reclaims", "retry"}, reclaim...)...); !strings.Contains(r.stdout, "nothing to retry") {
		t.Errorf("reclaims retry of a completed reclaim:\n%s", r.stdout)
	}
	// The reservation's reclaims list it, completed, its one VM terminated (the list is read
	// from an index: a moment after the commit).
	awaitListed(t, "the reclaim in reclaims list", func() bool {
		r := c.ok(tenantKey, "reclaims", "list", "--node", node, "--reservation", "res-op", "--state", "completed")
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `\s+completed\s+\S+\s+gpu-1\s+1/0/1\s+-$`).MatchString(r.stdout)
	})
	if r := c.ok(tenantKey, "reclaims", "list", "--node", node, "--reservation", "res-op", "--state", "failed"); !strings.Contains(r.stdout, "no failed reclaim operation") {
		t.Errorf("reclaims list --state failed:\n%s", r.stdout)
	}
	// Under -o json a refusal is the API's problem document on stdout, the exit code 1.
	r = c.run(tenantKey, "", "-o", "json", "reclaims", "get", "--node", node, "--reservation", "res-op", "--reclaim", "rcl_none")
	var problem struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &problem); err != nil || r.code != 1 || problem.Status != 404 || problem.Code != "not_found" {
		t.Errorf("reclaims get of no reclaim under -o json: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, err, r.stdout, r.stderr)
	}

	// 8b. A reclaim scheduled for later, read, and cancelled (twice: repeat-safe).
	r = c.ok(tenantKey, "reclaim", "--node", node, "--reservation", "res-op", "--units", "gpu-1", "--at", "2h", "--reason", "night batch")
	sm := regexp.MustCompile(`scheduled cancel --node \S+ --reservation res-op --id (\S+)`).FindStringSubmatch(r.stdout)
	if sm == nil || !strings.Contains(r.stdout, "state              scheduled") {
		t.Fatalf("reclaim --at:\n%s", r.stdout)
	}
	sched := []string{"--node", node, "--reservation", "res-op", "--id", sm[1]}
	if r := c.ok(tenantKey, append([]string{"scheduled", "get"}, sched...)...); !strings.Contains(r.stdout, "state              scheduled") || !strings.Contains(r.stdout, "reason             night batch") {
		t.Errorf("scheduled get:\n%s", r.stdout)
	}
	for range 2 {
		if r := c.ok(tenantKey, append([]string{"scheduled", "cancel"}, sched...)...); !strings.Contains(r.stdout, "state              cancelled") {
			t.Errorf("scheduled cancel:\n%s", r.stdout)
		}
	}
	if r := c.ok(tenantKey, "version"); !strings.Contains(r.stdout, "api  ") || !strings.Contains(r.stdout, strings.TrimSuffix(apiURL, "/")) {
		t.Errorf("version:\n%s", r.stdout)
	}

	// 9. The audit trail: listed, and its chain verified.
	if r := c.ok(op, "audit", "list", "--node", node, "--limit", "100"); !strings.Contains(r.stdout, "topology.set") || !strings.Contains(r.stdout, "reclaim") {
		t.Errorf("audit list:\n%s", r.stdout)
	}
	if r := c.ok(tenantKey, "audit", "list", "--node", node, "--reservation", "res-op"); !strings.Contains(r.stdout, "reservation.reaffirm") {
		t.Errorf("audit list of the reservation:\n%s", r.stdout)
	}
	// The tenant leaves: its key is revoked with a reason, which the keys' chain records.
	c.ok(op, "keys", "revoke", tk.Key.KeyID, "--reason", "tenant offboarded")
	byTarget := keyAudit(c, op)
	if rec := byTarget[boot.Key.KeyID+" "+capacity.ActionKeyCreate]; rec.Via != capacity.ViaDirect || rec.ActorKeyID != "bootstrap" {
		t.Errorf("the bootstrap key's record: %+v", rec)
	}
	if rec := byTarget[tk.Key.KeyID+" "+capacity.ActionKeyRevoke]; rec.Reason != "tenant offboarded" || rec.Via != capacity.ViaHTTP {
		t.Errorf("the tenant key's revoke record: %+v", rec)
	}
	if r := c.ok(op, "audit", "verify", "--node", node); !strings.HasPrefix(r.stdout, "OK: audit chain of node "+node) {
		t.Errorf("audit verify: %s", r.stdout)
	}
	if r := c.ok(op, "audit", "verify", "--keys"); !strings.HasPrefix(r.stdout, "OK: audit chain of keys") {
		t.Errorf("audit verify --keys: %s", r.stdout)
	}

	// 10. Alter the reclaim's record in the table: verify names it.
	id, seq := alterAuditRecord(t, node, "reclaim", "nothing to see here")
	r = c.run(op, "", "audit", "verify", "--node", node)
	if r.code != 1 || !strings.Contains(r.stdout, fmt.Sprintf("altered (its hash does not match its content) at record seq %d id %s", seq, id)) ||
		!strings.Contains(r.stdout, "action reclaim") {
		t.Errorf("audit verify after tampering: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// listKeys reads every key with capacityctl.
func listKeys(c *ctl, op string) []wire.KeyJSON {
	var all []wire.KeyJSON
	for cursor := ""; ; {
		var page wire.KeyPageJSON
		args := []string{"keys", "list", "--limit", "100"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		c.json(op, &page, args...)
		all = append(all, page.Keys...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
}

// narrowOperatorKeys checks that the bootstrap key holds every permission, then creates
// through the API the marketplace scheduler's key (operator, vm.place only) and a key
// manager's (key.manage and reservation.read, expiring within the hour), and shows that
// neither can do more than it holds: the scheduler gets the operator routes' 404 (it cannot
// mint a key, cancel a reservation or revoke the bootstrap key), and the key manager's
// attempts to grant what it lacks, to outlive itself or to revoke a stronger key are 403.
// Nothing they tried changed: neither made a key, and no key was revoked. It returns the
// scheduler's secret.
func narrowOperatorKeys(t *testing.T, c *ctl, op, bootKeyID string) string {
	t.Helper()
	for _, k := range listKeys(c, op) {
		if k.KeyID == bootKeyID && strings.Join(k.Permissions, ",") != strings.Join(capacity.AllPermissions, ",") {
			t.Errorf("the bootstrap key holds %v, want every permission", k.Permissions)
		}
	}
	type created struct {
		Key    struct{ KeyID string } `json:"key"`
		Secret string                 `json:"secret"`
	}
	var sched, mgr created
	c.json(op, &sched, "keys", "create", "--org", "org-platform", "--operator", "--permissions", "vm.place", "--description", "marketplace scheduler")
	c.json(op, &mgr, "keys", "create", "--org", "org-platform", "--operator", "--permissions", "key.manage,reservation.read",
		"--expires", "1h", "--description", "key manager")

	for _, args := range [][]string{
		{"keys", "create", "--org", "org-platform", "--operator", "--permissions", strings.Join(capacity.AllPermissions, ","), "--description", "escalate"},
		{"keys", "list"},
		{"keys", "revoke", bootKeyID, "--reason", "take over"},
		{"nodes", "put", "--node", "node-x", "--owner", "org-x", "--units", "gpu-0", "--agent-endpoint", agents.Endpoint("node-x")},
		{"audit", "verify", "--keys"},
	} {
		if r := c.run(sched.Secret, "", args...); r.code != 1 || !strings.Contains(r.stderr, "404 not_found") {
			t.Errorf("%v as the scheduler: exit %d %s; want 404", args, r.code, r.stderr)
		}
	}
	for _, args := range [][]string{
		{"keys", "create", "--org", "org-platform", "--operator", "--permissions", "key.manage,node.manage", "--expires", "30m"},
		{"keys", "create", "--org", "org-acme", "--permissions", "reservation.capacity", "--expires", "30m"},
		{"keys", "create", "--org", "org-acme", "--permissions", "reservation.read"},
		{"keys", "create", "--org", "org-acme", "--permissions", "reservation.read", "--expires", "2h"},
		{"keys", "create", "--org", "org-acme", "--operator", "--permissions", "reservation.read", "--expires", "30m"},
		{"keys", "revoke", bootKeyID, "--reason", "take over"},
	} {
		if r := c.run(mgr.Secret, "", args...); r.code != 1 || !strings.Contains(r.stderr, "403 forbidden") {
			t.Errorf("%v as the key manager: exit %d %s; want 403", args, r.code, r.stderr)
		}
	}
	for _, k := range listKeys(c, op) {
		if k.CreatedBy == sched.Key.KeyID || k.CreatedBy == mgr.Key.KeyID || k.KeyID == bootKeyID && k.Revoked {
			t.Errorf("a refused call changed the keys: %+v", k)
		}
	}
	// Within what it holds, the key manager works.
	var ok created
	c.json(mgr.Secret, &ok, "keys", "create", "--org", "org-acme", "--permissions", "reservation.read", "--expires", "30m", "--description", "auditor")
	if ok.Secret == "" {
		t.Errorf("a key within the key manager's own: %+v", ok)
	}
	return sched.Secret
}

// keyAudit reads the whole keys' chain with capacityctl and indexes its records by
// "<targetKeyId> <action>".
func keyAudit(c *ctl, key string) map[string]wire.AuditRecordJSON {
	c.t.Helper()
	out := map[string]wire.AuditRecordJSON{}
	cursor := ""
	for range 100 {
		var page wire.AuditChainPageJSON
		args := []string{"audit", "list", "--keys", "--limit", "100"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		c.json(key, &page, args...)
		for _, r := range page.Records {
			out[r.TargetKeyID+" "+r.Action] = r
		}
		if cursor = page.NextCursor; cursor == "" {
			return out
		}
	}
	c.t.Fatal("the keys' chain did not end within 100 pages")
	return nil
}

// alterAuditRecord changes the Reason of the node's (real, not dry-run) audit record with
// action, directly in the table, and returns the record's id and seq.
func alterAuditRecord(t *testing.T, node, action, reason string) (string, int64) {
	t.Helper()
	for _, item := range auditOf(t, node) {
		var rec struct {
			ID     string
			Action string
			DryRun bool
			Seq    int64 `dynamodbav:"seq"`
		}
		if err := attributevalue.UnmarshalMap(item, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Action != action || rec.DryRun {
			continue
		}
		upd, err := expression.NewBuilder().WithUpdate(expression.Set(expression.Name("Reason"), expression.Value(reason))).Build()
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
			TableName:        aws.String(store.AuditTable),
			Key:              map[string]types.AttributeValue{"pk": item["pk"], "sk": item["sk"]},
			UpdateExpression: upd.Update(), ExpressionAttributeNames: upd.Names(), ExpressionAttributeValues: upd.Values(),
		})
		if err != nil {
			t.Fatalf("alter audit record %s: %v", rec.ID, err)
		}
		return rec.ID, rec.Seq
	}
	t.Fatalf("node %s has no %s audit record", node, action)
	return "", 0
}

// TestOperatingNodeDescribe: what the demo node's people see of it with capacityctl (a copy
// of the demo node: docs/operating.md shows the owner's view). The owner: every unit in a
// word for its state, its reservation, the VM on it with its age, and the dry run to run
// next; the audience: its reservation's units, another org's VM without its id, no owner.
func TestOperatingNodeDescribe(t *testing.T) {
	if faultSpec != "" {
		t.Skip("exact answers: not under injected faults")
	}
	c := newCtl(t)
	node := newNode(t, nil)
	// words folds a table's runs of spaces, so that a check reads as a row does.
	words := func(s string) string {
		lines := strings.Split(s, "\n")
		for i, l := range lines {
			lines[i] = strings.Join(strings.Fields(l), " ")
		}
		return strings.Join(lines, "\n")
	}
	age := `(\d+s|\d+m|\d+h(\d+m)?|\d+d(\d+h)?)` // ageSince's forms
	owner := c.ok(keyOwner, "nodes", "describe", "--node", node)
	t.Logf("capacityctl nodes describe --node %s (the owner):\n%s", node, owner.stdout)
	got := words(owner.stdout)
	for _, want := range []string{
		"Node: " + node, "Owner org: " + demo.OrgOwner, "Topology gen: 1",
		"Unit states: 8 shown: 1 exclusive, 2 released, 3 spot, 2 occupied",
		"ID STATUS ACCESS RESERVED RELEASED",
		"UNIT STATE RESERVATION MODE VM TIER VM STATE AGE",
		"to see what reclaiming res-1's released units would evict: capacityctl reclaim --dry-run --node " + node + " --reservation res-1 --units ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the owner's describe lacks %q:\n%s", want, owner.stdout)
		}
	}
	for unit, u := range demoUnits {
		mode := "-"
		switch {
		case u.reservation != "" && (u.state == "spot" || u.state == "released"):
			mode = "released"
		case u.reservation != "":
			mode = "exclusive"
		}
		row := unit + " " + u.state + " " + orDash(u.reservation) + " " + mode + " "
		if u.vm == "" {
			row = regexp.QuoteMeta(row + "- - - -")
		} else {
			row = regexp.QuoteMeta(row+u.vm+" "+u.tier+" running ") + age
		}
		if !regexp.MustCompile(`(?m)^` + row + `$`).MatchString(got) {
			t.Errorf("the owner's describe has no row %s:\n%s", row, owner.stdout)
		}
	}

	audience := c.ok(keyAudience, "nodes", "describe", "--node", node)
	t.Logf("capacityctl nodes describe --node %s (the audience):\n%s", node, audience.stdout)
	got = words(audience.stdout)
	for _, want := range []string{"Owner org: (not shown)", "res-1 active view ", "gpu-2 spot res-1 released (not shown) spot running "} {
		if !strings.Contains(got, want) {
			t.Errorf("the audience's describe lacks %q:\n%s", want, audience.stdout)
		}
	}
	for _, no := range []string{"gpu-7", "vm-spot-1", "vm-od-1", demo.OrgOwner, "to see what reclaiming"} {
		if strings.Contains(got, no) {
			t.Errorf("the audience's describe shows %q:\n%s", no, audience.stdout)
		}
	}

	// The owner's node list shows the node with its strip of states, a letter a unit.
	awaitListed(t, "node "+node+" in nodes list", func() bool {
		r := c.ok(keyOwner, "nodes", "list", "--all", "--states")
		return strings.Contains(words(r.stdout), node+" "+demo.OrgOwner+" 8 (gpu-0..gpu-7) 1 OESSRRSO")
	})
	// A refusal about units names the command that shows them.
	r := c.run(keyOwner, "", "release", "--node", node, "--reservation", "res-1", "--units", "gpu-0")
	if r.code != 1 || !strings.Contains(r.stderr, "next: capacityctl nodes describe --node "+node) {
		t.Errorf("release of a unit in use: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	// A node nobody may see is the API's 404.
	if r := c.run(keyOwner, "", "nodes", "describe", "--node", "node-none"); r.code != 1 || !strings.Contains(r.stderr, "404 not_found") {
		t.Errorf("describe of no node: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
