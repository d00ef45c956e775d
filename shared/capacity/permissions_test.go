package capacity_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/routes"
)

// without returns p without the permission.
func without(p capacity.Principal, perm string) capacity.Principal {
	p.Permissions = slices.DeleteFunc(slices.Clone(p.Permissions), func(x string) bool { return x == perm })
	return p
}

// operatorWith is an operator of org platform holding exactly perms.
func operatorWith(perms ...string) capacity.Principal {
	return capacity.Principal{KeyID: "key-narrow", OrgID: "platform", Operator: true, Permissions: perms}
}

// operatorCalls calls the service as each operator route of the route table does, by
// operationId, against world's n1/r1 and the key key-target.
var operatorCalls = map[string]func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error{
	"putNode": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.PutNode(ctx, p, capacity.NodeRequest{NodeID: "n9", OwnerOrgID: "o", UnitIDs: []string{"u0"}, AgentEndpoint: "https://a.example"}, capacity.RequestMeta{})
		return err
	},
	"setTopology": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.SetTopology(ctx, p, capacity.TopologyRequest{NodeID: "n1", UnitIDs: []string{"u0", "u1", "u2"}}, capacity.RequestMeta{})
		return err
	},
	"listNodeAudit": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.ListNodeAudit(ctx, p, "n1", "", capacity.PageRequest{})
		return err
	},
	"createReservation": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.CreateReservation(ctx, p, capacity.ReservationRequest{NodeID: "n1", StartsAt: t0, ReservedUnitIDs: []string{"u3"}}, capacity.RequestMeta{})
		return err
	},
	"cancelReservation": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.CancelReservation(ctx, p, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
		return err
	},
	"reaffirmReservation": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.ReaffirmReservation(ctx, p, capacity.ReservationChange{NodeID: "n1", ReservationID: "r1"}, capacity.RequestMeta{})
		return err
	},
	"createKey": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.CreateKey(ctx, p, capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermKeyManage}}, capacity.RequestMeta{})
		return err
	},
	"listKeys": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.ListKeys(ctx, p, capacity.PageRequest{})
		return err
	},
	"getKey": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.GetKey(ctx, p, "key-target")
		return err
	},
	"revokeKey": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.RevokeKey(ctx, p, capacity.KeyRevocation{KeyID: "key-target"}, capacity.RequestMeta{})
		return err
	},
	"listKeyAudit": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.ListKeyAudit(ctx, p, capacity.PageRequest{})
		return err
	},
	"rotateAgentKey": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.RotateAgentKey(ctx, p, capacity.AgentKeyRotation{NodeID: "n1", Reason: "r"}, capacity.RequestMeta{})
		return err
	},
	"endAgentKeyOverlap": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.EndAgentKeyOverlap(ctx, p, capacity.AgentKeyRotation{NodeID: "n1", Reason: "r"}, capacity.RequestMeta{})
		return err
	},
	"forceEndVM": func(ctx context.Context, svc *capacity.Service, p capacity.Principal) error {
		_, err := svc.ForceEnd(ctx, p, capacity.ForceEndRequest{NodeID: "n1", ReservationID: "r1", ReclaimID: permReclaimID, VMID: "s1", Reason: "gone"}, capacity.RequestMeta{})
		return err
	},
}

// permReclaimID is the reclaim operation permWorld made (evicting s1; still terminating).
var permReclaimID string

// permWorld is world with key management, one key, key-target, that a holder of
// key.manage alone may revoke, and a reclaim operation (permReclaimID).
func permWorld(t *testing.T) (*dynamotest.Env, *capacity.Service) {
	env, svc := world(t)
	res, err := svc.Reclaim(context.Background(), owner, reclaim("u1"), capacity.RequestMeta{})
	if err != nil || res.ReclaimID == "" {
		t.Fatalf("reclaim: %+v, %v", res, err)
	}
	permReclaimID = res.ReclaimID
	svc.Keys = env.Store
	svc.AgentKeySealer = &testSealer{}
	target := capacity.APIKey{KeyID: "key-target", Hash: capacity.HashKeySecret(capacity.FixedKeySecret("target")), OrgID: "platform", Operator: true, Permissions: []string{capacity.PermKeyManage}}
	if err := env.Store.Put(context.Background(), dynamo.Seed{Keys: []capacity.APIKey{target}}); err != nil {
		t.Fatal(err)
	}
	return env, svc
}

// allItems is every table of the world: state, audit and keys.
func allItems(t *testing.T, env *dynamotest.Env) [][]map[string]types.AttributeValue {
	t.Helper()
	return [][]map[string]types.AttributeValue{
		env.Items(t, env.Store.Table), env.Items(t, env.Store.AuditTable), env.Items(t, env.Store.KeysTable),
	}
}

// TestOperatorRoutePermissions: each operator route of the route table, called by an
// operator holding every permission but the route's own, by the marketplace scheduler's key
// (operator, vm.place) and by a tenant with every tenant permission, is the one 404 a
// non-operator gets, and changes nothing in any table (no audit record either). An operator
// holding only the route's permission gets past it.
func TestOperatorRoutePermissions(t *testing.T) {
	ctx := context.Background()
	seen := 0
	for _, rt := range routes.All {
		if rt.Permission == "" {
			continue
		}
		seen++
		call, ok := operatorCalls[rt.OperationID]
		if !ok {
			t.Errorf("%s %s (%s): no call in operatorCalls", rt.Method, rt.Path, rt.OperationID)
			continue
		}
		t.Run(rt.OperationID, func(t *testing.T) {
			env, svc := permWorld(t)
			before := allItems(t, env)
			tenant := capacity.Principal{KeyID: "key-tenant", OrgID: "owner", Permissions: []string{capacity.PermCapacity, capacity.PermRead, capacity.PermPlace}}
			want := call(ctx, svc, tenant)
			if code(want) != capacity.CodeNotFound {
				t.Fatalf("tenant: %v, want not_found", want)
			}
			for name, p := range map[string]capacity.Principal{
				"operator without " + rt.Permission: without(capacity.Bootstrap("platform"), rt.Permission),
				"marketplace scheduler":             operatorWith(capacity.PermPlace),
				"operator flag, no permission":      operatorWith(),
				"tenant holding " + rt.Permission:   {KeyID: "key-t2", OrgID: "owner", Permissions: []string{rt.Permission}},
			} {
				if err := call(ctx, svc, p); !reflect.DeepEqual(err, want) {
					t.Errorf("%s: %v, want the tenant's %v", name, err, want)
				}
			}
			if after := allItems(t, env); !reflect.DeepEqual(after, before) {
				t.Errorf("refused calls changed the tables")
			}
			if err := call(ctx, svc, operatorWith(rt.Permission)); code(err) == capacity.CodeNotFound {
				t.Errorf("operator holding only %s: %v, want past the gate", rt.Permission, err)
			}
		})
	}
	if seen != len(operatorCalls) {
		t.Errorf("%d operator routes in the table, %d calls here", seen, len(operatorCalls))
	}
}

// TestOperatorPermissionsMatchTheRouteTable: the domain's and the route table's lists of
// operator permissions are the same (shared/routes imports no project package).
func TestOperatorPermissionsMatchTheRouteTable(t *testing.T) {
	var table []string
	for _, rt := range routes.All {
		if rt.Permission != "" && !slices.Contains(table, rt.Permission) {
			table = append(table, rt.Permission)
		}
	}
	slices.Sort(table)
	if !slices.Equal(table, capacity.OperatorPermissions) {
		t.Errorf("route table permissions %v, capacity.OperatorPermissions %v", table, capacity.OperatorPermissions)
	}
}

// TestNodeReadsNeedAPermission: the operator flag alone no longer reads every node or lists
// every reservation; reservation.read (or, for a node, node.manage) does.
func TestNodeReadsNeedAPermission(t *testing.T) {
	_, svc := permWorld(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		p        capacity.Principal
		node     bool
		listRead bool
	}{
		{"marketplace scheduler", operatorWith(capacity.PermPlace), false, false},
		{"operator, node.manage", operatorWith(capacity.PermNodeManage), true, false},
		{"operator, reservation.read", operatorWith(capacity.PermRead), true, true},
		{"another org, reservation.read", capacity.Principal{OrgID: "stranger", Permissions: []string{capacity.PermRead}}, false, false},
	} {
		_, err := svc.GetNode(ctx, tt.p, "n1")
		if (err == nil) != tt.node {
			t.Errorf("%s: get node: %v, want allowed %v", tt.name, err, tt.node)
		}
		_, err = svc.ListReservations(ctx, tt.p, "n1", capacity.PageRequest{})
		if (err == nil) != tt.listRead {
			t.Errorf("%s: list reservations: %v, want allowed %v", tt.name, err, tt.listRead)
		}
	}
}

// TestNoKeyGrantsMoreThanItsCreatorHolds: every way of asking for more than the calling key
// holds is refused with 403 and writes nothing (no key, no audit record, no idempotency
// record); asking for exactly as much, or less, works.
func TestNoKeyGrantsMoreThanItsCreatorHolds(t *testing.T) {
	until := keyT0.Add(30 * 24 * time.Hour)
	later, earlier := until.Add(time.Second), until.Add(-time.Hour)
	mgr := withKeyID(operatorWith(capacity.PermKeyManage, capacity.PermRead), "key-mgr")
	expiring := mgr
	expiring.ExpiresAt = &until
	tests := []struct {
		name string
		p    capacity.Principal
		req  capacity.KeyRequest
		want string // "" allowed, else part of the 403's message
	}{
		{"a permission it lacks", mgr, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermCapacity}}, "reservation.capacity"},
		{"an operator permission it lacks", mgr, capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermKeyManage, capacity.PermNodeManage}}, "node.manage"},
		{"every permission", mgr, capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}, "audit.read"},
		{"an operator key for another org", mgr, capacity.KeyRequest{OrgID: "org-1", Operator: true, Permissions: []string{capacity.PermRead}}, "own org"},
		{"no expiry from an expiring key", expiring, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}}, "must expire"},
		{"a later expiry", expiring, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, ExpiresAt: &later}, "outlive"},
		{"key.manage from a holder of key.manage (as much as it holds)", mgr, capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: []string{capacity.PermKeyManage, capacity.PermRead}}, ""},
		{"less than it holds", mgr, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}}, ""},
		{"the same expiry", expiring, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, ExpiresAt: &until}, ""},
		{"an earlier expiry", expiring, capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, ExpiresAt: &earlier}, ""},
		{"anything, bootstrap", capacity.Bootstrap("platform"), capacity.KeyRequest{OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemKeys()
			tt.req.IdempotencyKey = "idem-1"
			res, err := keyService(store).CreateKey(context.Background(), tt.p, tt.req, capacity.RequestMeta{})
			if tt.want == "" {
				if err != nil || len(store.keys) != 1 {
					t.Fatalf("err = %v, keys %d; want the key", err, len(store.keys))
				}
				if !slices.Equal(res.Key.Permissions, slices.Sorted(slices.Values(tt.req.Permissions))) {
					t.Errorf("key holds %v, asked %v", res.Key.Permissions, tt.req.Permissions)
				}
				return
			}
			wantCode(t, err, capacity.CodeForbidden)
			if !strings.Contains(capacity.ErrorMessage(err), tt.want) {
				t.Errorf("message %q does not mention %q", capacity.ErrorMessage(err), tt.want)
			}
			if len(store.keys)+len(store.audits)+len(store.idem)+store.reads != 0 {
				t.Errorf("a refused grant read %d times and wrote %d keys, %d audit records, %d idempotency records",
					store.reads, len(store.keys), len(store.audits), len(store.idem))
			}
		})
	}
}

// TestRevokeOnlyWhatItCouldGrant: a key manager revokes itself and keys holding nothing it
// lacks; a key above it is refused with 403 and stays as it was, unaudited.
func TestRevokeOnlyWhatItCouldGrant(t *testing.T) {
	mgr := withKeyID(operatorWith(capacity.PermKeyManage, capacity.PermRead), "key-mgr")
	tests := []struct {
		name   string
		target capacity.APIKey
		ok     bool
	}{
		{"itself", capacity.APIKey{KeyID: "key-mgr", OrgID: "platform", Operator: true, Permissions: mgr.Permissions}, true},
		{"a tenant key it could grant", capacity.APIKey{KeyID: "key-t", OrgID: "org-1", Permissions: []string{capacity.PermRead}}, true},
		{"a stray operator key of another org", capacity.APIKey{KeyID: "key-t", OrgID: "org-1", Operator: true, Permissions: []string{capacity.PermRead}}, true},
		{"a key with a permission it lacks", capacity.APIKey{KeyID: "key-t", OrgID: "org-1", Permissions: []string{capacity.PermCapacity}}, false},
		{"the full operator key", capacity.APIKey{KeyID: "key-t", OrgID: "platform", Operator: true, Permissions: capacity.AllPermissions}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemKeys()
			store.keys[tt.target.KeyID] = tt.target
			k, err := keyService(store).RevokeKey(context.Background(), mgr, capacity.KeyRevocation{KeyID: tt.target.KeyID, Reason: "r"}, capacity.RequestMeta{})
			if tt.ok {
				if err != nil || !k.Revoked || !store.keys[tt.target.KeyID].Revoked || len(store.audits) != 1 {
					t.Fatalf("revoke = %+v, %v; audits %d", k, err, len(store.audits))
				}
				return
			}
			wantCode(t, err, capacity.CodeForbidden)
			if !reflect.DeepEqual(store.keys[tt.target.KeyID], tt.target) || len(store.audits) != 0 {
				t.Errorf("a refused revoke changed the key (%+v) or audited (%d)", store.keys[tt.target.KeyID], len(store.audits))
			}
		})
	}
}

// TestNodeTopologyAllowsTopologyOnly: the fleet's event principal (operator, node.topology)
// changes a node's topology and nothing else of node.manage's.
func TestNodeTopologyAllowsTopologyOnly(t *testing.T) {
	_, svc := permWorld(t)
	ctx := context.Background()
	fleet := operatorWith(capacity.PermTopology)
	if err := operatorCalls["setTopology"](ctx, svc, fleet); err != nil {
		t.Errorf("topology by the fleet: %v", err)
	}
	if err := operatorCalls["putNode"](ctx, svc, fleet); code(err) != capacity.CodeNotFound {
		t.Errorf("node put by the fleet: %v, want not_found", err)
	}
	if _, err := svc.GetNode(ctx, fleet, "n1"); code(err) != capacity.CodeNotFound {
		t.Errorf("node read by the fleet: %v, want not_found", err)
	}
}
