package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	apiclient "github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// demoUnit is a unit of the demo node as its owner sees it.
type demoUnit struct {
	state, reservation, vm, tier string
}

// demoUnits are the demo node's units as the seed leaves them (localstack/demo).
var demoUnits = map[string]demoUnit{
	"gpu-0": {"occupied", "res-1", "vm-res-1", "reserved"},
	"gpu-1": {"exclusive", "res-1", "", ""},
	"gpu-2": {"spot", "res-1", "vm-spot-1", "spot"},
	"gpu-3": {"spot", "res-1", "vm-spot-2", "spot"},
	"gpu-4": {"released", "res-1", "", ""},
	"gpu-5": {"released", "res-1", "", ""},
	"gpu-6": {"spot", "", "vm-spot-2", "spot"}, // vm-spot-2 spans a reserved and an unreserved unit
	"gpu-7": {"occupied", "", "vm-od-1", "on-demand"},
}

// nodeUnits reads the node's unit view through API Gateway (the contract checks its answer
// against the OpenAPI document).
func nodeUnits(t *testing.T, node, key string) (int, wire.NodeUnitsJSON) {
	t.Helper()
	r := call(t, http.MethodGet, "/v1/nodes/"+node+"/units", key, nil)
	var v wire.NodeUnitsJSON
	if r.Status == http.StatusOK {
		if err := json.Unmarshal(r.Body, &v); err != nil {
			t.Fatalf("units: %v: %s", err, r.Body)
		}
	}
	return r.Status, v
}

// listedNodes pages through GET /v1/nodes with the client, 2 nodes a page, and returns the
// nodes by id.
func listedNodes(t *testing.T, key string) map[string]wire.NodeListingJSON {
	t.Helper()
	api := apiclient.New(apiURL, key, httpClient)
	out := map[string]wire.NodeListingJSON{}
	page := apiclient.Page{Limit: 2}
	last := ""
	for {
		p, _, err := api.ListNodes(context.Background(), page)
		if err != nil {
			t.Fatalf("list nodes: %v", err)
		}
		for _, n := range p.Nodes {
			if n.NodeID <= last {
				t.Fatalf("node %s listed after %s: not in id order", n.NodeID, last)
			}
			last = n.NodeID
			out[n.NodeID] = n
		}
		if p.NextCursor == "" {
			return out
		}
		page.Cursor = p.NextCursor
	}
}

// strangerKey seeds a key of an org with every tenant permission and no role on any node.
func strangerKey(t *testing.T) string {
	t.Helper()
	secret := auth.NewSecret()
	k := capacity.APIKey{KeyID: fmt.Sprintf("key-nodeview-%d", time.Now().UnixNano()), OrgID: "org-stranger-nv",
		Permissions: []string{capacity.PermCapacity, capacity.PermRead}, Hash: auth.Hash(secret), Description: "node view: a stranger"}
	if err := store.Keys().Put(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	return secret
}

// awaitListed polls the lists (an index, eventually consistent) until cond holds.
func awaitListed(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within 10s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestNodeViewLists(t *testing.T) {
	node := newNode(t, nil)
	stranger := strangerKey(t)
	// The demo's callers see the node (the owner and operator with its owner org; the
	// managing and audience orgs without it); a stranger does not.
	for _, tt := range []struct {
		name, key string
		owner     string
	}{
		{"owner", keyOwner, demo.OrgOwner},
		{"operator", keyOperator, demo.OrgOwner},
		{"manager", keyManager, ""},
		{"audience", keyAudience, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n wire.NodeListingJSON
			awaitListed(t, "node "+node+" in the list", func() bool {
				var ok bool
				n, ok = listedNodes(t, tt.key)[node]
				return ok
			})
			if n.OwnerOrgID != tt.owner || n.TopologyGen != 1 || len(n.UnitIDs) != 8 {
				t.Errorf("listed %+v, want owner %q, topologyGen 1, 8 units", n, tt.owner)
			}
		})
	}
	if _, ok := listedNodes(t, stranger)[node]; ok {
		t.Errorf("a stranger lists node %s", node)
	}
	// Strict query, and a cursor of another list.
	for _, q := range []string{"?limit=0", "?limit=101", "?cursor=x", "?state=failed", "?limit=1&limit=2"} {
		if r := call(t, http.MethodGet, "/v1/nodes"+q, keyOwner, nil); r.Status != http.StatusBadRequest && r.Status != http.StatusUnprocessableEntity {
			t.Errorf("GET /v1/nodes%s: %d %s", q, r.Status, r.Body)
		}
	}
	// A key that may read nothing gets the list's 404.
	if r := call(t, http.MethodGet, "/v1/nodes", demo.SchedulerSecret, nil); r.Status != http.StatusNotFound {
		t.Errorf("the scheduler's key: %d %s", r.Status, r.Body)
	}
}

func TestNodeViewUnits(t *testing.T) {
	node := newNode(t, nil)
	for _, key := range []string{keyOwner, keyOperator} {
		status, v := nodeUnits(t, node, key)
		if status != http.StatusOK || v.NodeID != node || len(v.Units) != 8 {
			t.Fatalf("units: %d %+v", status, v)
		}
		for _, u := range v.Units {
			want := demoUnits[u.UnitID]
			got := demoUnit{u.State, u.ReservationID, "", ""}
			if u.VM != nil {
				got.vm, got.tier = u.VM.VMID, u.VM.Tier
				if u.VM.OrgID == "" || u.VM.State != "running" || u.VM.Since == "" {
					t.Errorf("%s: the owner sees VM %+v", u.UnitID, *u.VM)
				}
			}
			if got != want {
				t.Errorf("%s: got %+v, want %+v", u.UnitID, got, want)
			}
		}
		if len(v.Reservations) != 1 || v.Reservations[0].ID != "res-1" || v.Reservations[0].Access != "manage" {
			t.Errorf("reservations: %+v", v.Reservations)
		}
	}

	// The audience sees res-1's units only, and of the VMs on them only its own org's ids.
	status, v := nodeUnits(t, node, keyAudience)
	if status != http.StatusOK {
		t.Fatalf("audience: %d", status)
	}
	var ids []string
	for _, u := range v.Units {
		ids = append(ids, u.UnitID)
		if want := demoUnits[u.UnitID]; u.State != want.state {
			t.Errorf("audience: %s is %s, want %s", u.UnitID, u.State, want.state)
		}
		if u.VM == nil {
			continue
		}
		if u.VM.VMID != "" && u.VM.VMID != "vm-res-1" || u.VM.OrgID != "" && u.VM.OrgID != demo.OrgAudience {
			t.Errorf("audience sees a foreign VM on %s: %+v", u.UnitID, *u.VM)
		}
	}
	if !slices.Equal(ids, []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"}) {
		t.Errorf("audience sees units %v", ids)
	}
	if v.Units[0].VM == nil || v.Units[0].VM.VMID != "vm-res-1" || v.Units[2].VM == nil || v.Units[2].VM.VMID != "" {
		t.Errorf("audience: gpu-0 %+v, gpu-2 %+v", v.Units[0].VM, v.Units[2].VM)
	}
	if len(v.Reservations) != 1 || v.Reservations[0].Access != "view" {
		t.Errorf("audience reservations: %+v", v.Reservations)
	}

	// The managing org sees every VM id on res-1's units, and no VM's org but its own.
	_, v = nodeUnits(t, node, keyManager)
	if len(v.Units) != 6 || v.Units[2].VM == nil || v.Units[2].VM.VMID != "vm-spot-1" || v.Units[2].VM.OrgID != "" {
		t.Errorf("manager: %+v", v.Units)
	}

	// A stranger, and anyone asking for a node that does not exist, get the same 404.
	stranger := strangerKey(t)
	for _, tt := range []struct{ node, key string }{{node, stranger}, {node + "-none", keyOwner}, {node, demo.SchedulerSecret}} {
		r := call(t, http.MethodGet, "/v1/nodes/"+tt.node+"/units", tt.key, nil)
		if r.Status != http.StatusNotFound || r.json(t)["detail"] != "node not found" {
			t.Errorf("units of %s: %d %s", tt.node, r.Status, r.Body)
		}
	}
}

func TestNodeViewReclaims(t *testing.T) {
	node := newNode(t, nil)
	ctx := context.Background()
	owner := apiclient.New(apiURL, keyOwner, httpClient)
	first, _, err := owner.Reclaim(ctx, node, demo.ReservationID, apiclient.ReclaimRequest{UnitIDs: []string{"gpu-2"}, Reason: "node view"}, apiclient.Options{})
	if err != nil || first.ReclaimID == "" {
		t.Fatalf("reclaim gpu-2: %v %+v", err, first)
	}
	awaitOperation(t, node, first.ReclaimID, 60*time.Second)
	second, _, err := owner.Reclaim(ctx, node, demo.ReservationID, apiclient.ReclaimRequest{UnitIDs: []string{"gpu-3"}, Reason: "node view"}, apiclient.Options{})
	if err != nil || second.ReclaimID == "" {
		t.Fatalf("reclaim gpu-3: %v %+v", err, second)
	}
	ids := func(state string, page apiclient.Page, key string) ([]string, string) {
		t.Helper()
		p, _, err := apiclient.New(apiURL, key, httpClient).ListReclaims(ctx, node, demo.ReservationID, state, page)
		if err != nil {
			t.Fatalf("list reclaims (%s): %v", state, err)
		}
		var out []string
		for _, op := range p.Reclaims {
			out = append(out, op.ID)
		}
		return out, p.NextCursor
	}
	// Newest first, the second reclaim's VM in flight or done.
	awaitListed(t, "both reclaims listed", func() bool {
		got, _ := ids("", apiclient.Page{}, keyOwner)
		return slices.Equal(got, []string{second.ReclaimID, first.ReclaimID})
	})
	awaitOperation(t, node, second.ReclaimID, 60*time.Second)
	if got, _ := ids("completed", apiclient.Page{}, keyManager); !slices.Equal(got, []string{second.ReclaimID, first.ReclaimID}) {
		t.Errorf("completed: %v", got)
	}
	if got, _ := ids("failed", apiclient.Page{}, keyOwner); len(got) != 0 {
		t.Errorf("failed: %v", got)
	}
	if got, _ := ids("in-flight", apiclient.Page{}, keyOwner); len(got) != 0 {
		t.Errorf("in flight: %v", got)
	}
	// One a page: the cursor leads from the newest to the first.
	page1, next := ids("", apiclient.Page{Limit: 1}, keyOwner)
	page2, last := ids("", apiclient.Page{Limit: 1, Cursor: next}, keyOwner)
	if !slices.Equal(page1, []string{second.ReclaimID}) || next == "" || !slices.Equal(page2, []string{first.ReclaimID}) || last != "" {
		t.Errorf("pages %v (%q), %v (%q)", page1, next, page2, last)
	}
	// The audience gets the redacted view (no VM ids); the whole view names vm-spot-1.
	r := call(t, http.MethodGet, reservationListPath(node)+"?state=completed", keyAudience, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("audience: %d %s", r.Status, r.Body)
	}
	var aud wire.ReclaimPageJSON
	if err := json.Unmarshal(r.Body, &aud); err != nil || len(aud.Reclaims) != 2 || aud.Reclaims[0].VMs != nil || aud.Reclaims[0].VMCounts == nil {
		t.Errorf("audience's reclaims: %v %s", err, r.Body)
	}
	// Bad filters and cursors are refused; a stranger gets the reservation's 404.
	for _, q := range []string{"?state=done", "?cursor=" + next + "x", "?limit=0", "?states=failed"} {
		if r := call(t, http.MethodGet, reservationListPath(node)+q, keyOwner, nil); r.Status != http.StatusBadRequest && r.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s: %d %s", q, r.Status, r.Body)
		}
	}
	if r := call(t, http.MethodGet, reservationListPath(node), strangerKey(t), nil); r.Status != http.StatusNotFound {
		t.Errorf("stranger: %d %s", r.Status, r.Body)
	}
}

func reservationListPath(node string) string {
	return "/v1/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaims"
}
