package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// owner2 is a second key of the node owner's org.
var owner2 = capacity.Principal{KeyID: "k-owner2", OrgID: "owner", Permissions: []string{capacity.PermCapacity}}

// An Idempotency-Key belongs to the key that sent it: the same key's retry replays, while
// another key (of the same org or another) sending the same Idempotency-Key makes a request
// of its own, neither answered with the first key's stored result nor refused because of it.
func TestIdempotencyKeyScopedToTheCallingKey(t *testing.T) {
	operator := capacity.Principal{KeyID: "k-op2", OrgID: "platform", Operator: true, Permissions: []string{capacity.PermCapacity}}
	tests := []struct {
		name     string
		p        capacity.Principal
		units    []string
		replayed bool
	}{
		{"the same key, the same request", owner, []string{"u1"}, true},
		{"another key of the org, the same request", owner2, []string{"u1"}, false},
		{"another key of the org, another request", owner2, []string{"u2"}, false},
		{"another org's key, the same request", operator, []string{"u1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, svc := world(t)
			ctx := context.Background()
			first := reclaim("u1")
			first.IdempotencyKey = "shared-key"
			res, err := svc.Reclaim(ctx, owner, first, capacity.RequestMeta{})
			if err != nil || res.ReclaimID == "" {
				t.Fatalf("first: %+v, %v", res, err)
			}
			second := reclaim(tt.units...)
			second.IdempotencyKey = "shared-key"
			got, err := svc.Reclaim(ctx, tt.p, second, capacity.RequestMeta{})
			if err != nil {
				t.Fatalf("second: %v", err)
			}
			if got.Replayed != tt.replayed || (got.ReclaimID == res.ReclaimID) != tt.replayed {
				t.Errorf("second: replayed %v, reclaim %q (first %q); want replayed %v", got.Replayed, got.ReclaimID, res.ReclaimID, tt.replayed)
			}
		})
	}
}

// The service's own Idempotency-Key prefixes are refused to anyone who is not the service:
// "scheduled:" is the firing of a scheduled reclaim, "event:<id>" an event without a key of
// its own. A caller could otherwise take a scheduled reclaim's key first and have its firing
// answer the caller's result instead of running. The refusal writes nothing.
func TestReservedIdempotencyKeysAreRefused(t *testing.T) {
	keys := []struct {
		name    string
		key     string
		meta    capacity.RequestMeta
		refused bool
	}{
		{"scheduled: over HTTP", "scheduled:srcl_1", capacity.RequestMeta{}, true},
		{"event: over HTTP", "event:e1", capacity.RequestMeta{}, true},
		{"event: directly", "event:e1", capacity.RequestMeta{Via: capacity.ViaDirect}, true},
		{"scheduled: in an event", "scheduled:srcl_1", capacity.RequestMeta{Via: capacity.ViaEvent, EventID: "e1"}, true},
		{"another event's key in an event", "event:e2", capacity.RequestMeta{Via: capacity.ViaEvent, EventID: "e1"}, true},
		{"the event's own key", "event:e1", capacity.RequestMeta{Via: capacity.ViaEvent, EventID: "e1"}, false},
		{"a look-alike", "Scheduled:srcl_1", capacity.RequestMeta{}, false},
		{"the prefix inside", "my-event:e1", capacity.RequestMeta{}, false},
	}
	calls := []struct {
		name string
		do   func(svc *capacity.Service, key string, meta capacity.RequestMeta) error
	}{
		{"reclaim", func(svc *capacity.Service, key string, meta capacity.RequestMeta) error {
			req := reclaim("u1")
			req.IdempotencyKey = key
			_, err := svc.Reclaim(context.Background(), owner, req, meta)
			return err
		}},
		{"placement", func(svc *capacity.Service, key string, meta capacity.RequestMeta) error {
			_, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer",
				Tier: capacity.TierSpot, UnitIDs: []string{"u3"}, IdempotencyKey: key}, meta)
			return err
		}},
		{"topology", func(svc *capacity.Service, key string, meta capacity.RequestMeta) error {
			_, err := svc.SetTopology(context.Background(), op, capacity.TopologyRequest{NodeID: "n1",
				UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}, IdempotencyKey: key}, meta)
			return err
		}},
	}
	for _, c := range calls {
		for _, k := range keys {
			t.Run(c.name+"/"+k.name, func(t *testing.T) {
				env, svc := world(t)
				before := stateItems(t, env)
				err := c.do(svc, k.key, k.meta)
				if !k.refused {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					return
				}
				if capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
					t.Fatalf("err = %v, want invalid_request", err)
				}
				if after := stateItems(t, env); len(after) != len(before) {
					t.Errorf("a refused call wrote: %d items, then %d", len(before), len(after))
				}
			})
		}
	}
}

// A call answered from its Idempotency-Key record changes nothing but leaves an audit record
// of its own, outcome "replayed": who asked again, when, under which request id.
func TestReplayLeavesAnAuditRecord(t *testing.T) {
	at := t0.Add(2 * time.Hour)
	tests := []struct {
		name   string
		p      capacity.Principal
		action string
		do     func(svc *capacity.Service, meta capacity.RequestMeta) (replayed bool, err error)
	}{
		{"reclaim", owner, capacity.ActionReclaim, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			req := reclaim("u1")
			req.IdempotencyKey = "k"
			res, err := svc.Reclaim(context.Background(), owner, req, meta)
			return err == nil && res.Replayed, err
		}},
		{"release", owner, capacity.ActionRelease, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			req := reclaim("u1")
			req.IdempotencyKey = "k"
			res, err := svc.Release(context.Background(), owner, req, meta)
			return err == nil && res.Replayed, err
		}},
		{"placement", sched, capacity.ActionPlace, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			res, err := svc.Place(context.Background(), sched, capacity.PlacementRequest{NodeID: "n1", VMID: "s9", OrgID: "buyer",
				Tier: capacity.TierSpot, UnitIDs: []string{"u2"}, IdempotencyKey: "k"}, meta)
			return err == nil && res.Replayed, err
		}},
		{"scheduled reclaim", owner, capacity.ActionScheduleReclaim, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			req := reclaim("u1")
			req.IdempotencyKey = "k"
			res, err := svc.ScheduleReclaim(context.Background(), owner, req, at, meta)
			return err == nil && res.Replayed, err
		}},
		{"topology", op, capacity.ActionTopologySet, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			res, err := svc.SetTopology(context.Background(), op, capacity.TopologyRequest{NodeID: "n1",
				UnitIDs: []string{"u0", "u1", "u2", "u3", "u4"}, IdempotencyKey: "k"}, meta)
			return err == nil && res.Replayed, err
		}},
		{"node registration", op, capacity.ActionNodePut, func(svc *capacity.Service, meta capacity.RequestMeta) (bool, error) {
			res, err := svc.PutNode(context.Background(), op, capacity.NodeRequest{NodeID: "n1", OwnerOrgID: "owner",
				UnitIDs: []string{"u0", "u1", "u2", "u3"}, AgentEndpoint: "https://n1.example", IdempotencyKey: "k"}, meta)
			return err == nil && res.Replayed, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc, _, _ := schedWorld(t)
			if replayed, err := tt.do(svc, capacity.RequestMeta{RequestID: "req-1"}); err != nil || replayed {
				t.Fatalf("first: replayed %v, %v", replayed, err)
			}
			before := stateItems(t, env)
			if replayed, err := tt.do(svc, capacity.RequestMeta{RequestID: "req-2"}); err != nil || !replayed {
				t.Fatalf("retry: replayed %v, %v", replayed, err)
			}
			if after := stateItems(t, env); len(after) != len(before) {
				t.Errorf("a replay wrote state: %d items, then %d", len(before), len(after))
			}
			recs := replayRecords(t, env)
			if len(recs) != 1 {
				t.Fatalf("%d replay records, want 1", len(recs))
			}
			r := recs[0]
			if r["Action"] != tt.action || r["RequestID"] != "req-2" || r["ActorKeyID"] != tt.p.KeyID || r["CallerOrgID"] != tt.p.OrgID ||
				r["NodeID"] != "n1" || r["via"] != capacity.ViaHTTP {
				t.Errorf("replay record %v", r)
			}
		})
	}
}

// replayRecords are the audit records with outcome replayed, as their string attributes.
func replayRecords(t *testing.T, env *dynamotest.Env) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, it := range env.Items(t, env.Store.AuditTable) {
		if attrString(it["Outcome"]) != capacity.OutcomeReplayed {
			continue
		}
		m := map[string]string{}
		for k, v := range it {
			m[k] = attrString(v)
		}
		out = append(out, m)
	}
	return out
}

// A scheduled reclaim fires under "scheduled:<id>" as its creator. Were the creator's key
// (or, before keys were scoped per API key, anyone of its org) allowed to send that key first,
// the firing would replay that call's answer and never run, leaving the scheduled reclaim
// pending forever. The call is refused, and the firing runs.
func TestScheduledFiringKeyCannotBeTakenFirst(t *testing.T) {
	env, svc, _, clock := schedWorld(t)
	ctx := context.Background()
	id := scheduleU1(t, svc, clock)
	for _, p := range []capacity.Principal{owner, owner2} {
		taken := reclaim("u1")
		taken.IdempotencyKey = capacity.FireIdempotencyKey(id)
		if _, err := svc.Reclaim(ctx, p, taken, capacity.RequestMeta{}); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
			t.Fatalf("%s taking the firing's key: %v, want invalid_request", p.KeyID, err)
		}
	}
	*clock = clock.Add(time.Hour)
	fired, err := svc.FireScheduledReclaim(ctx, "n1", "r1", id, capacity.RequestMeta{EventID: "ev-1"})
	if err != nil || fired.Replayed || fired.ReclaimID == "" {
		t.Fatalf("fire = %+v, %v", fired, err)
	}
	if sr, err := env.Store.GetScheduled(ctx, "n1", id); err != nil || sr.State != capacity.ScheduledCompleted {
		t.Errorf("after the firing: %+v, %v", sr, err)
	}
}
