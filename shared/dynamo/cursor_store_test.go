package dynamo_test

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// A cursor the list did not hand out (another node's, of another key prefix, with an
// attribute too many, garbage) is the caller's 422 on every list that starts its Query at a
// cursor, and nothing is read: DynamoDB would answer such a start key with a
// ValidationException, a 500 at the caller's will.
func TestForgedCursorsAreRefusedBeforeAnyRead(t *testing.T) {
	env := newEnv(t, seed(4, 3))
	svc := auditService(env.Store)
	ctx := context.Background()
	for _, u := range []string{"u0", "u1", "u2"} {
		if _, err := svc.Reclaim(ctx, auditOwner, capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{u}}, capacity.RequestMeta{}); err != nil {
			t.Fatal(err)
		}
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	type list struct {
		name string
		read func(cursor string) error
	}
	lists := []list{
		{"reservation audit", func(c string) error {
			_, _, err := env.Store.ReservationAudit(ctx, "n1", "r1", capacity.ChainChanges, 2, c)
			return err
		}},
		{"reservation calls", func(c string) error {
			_, _, err := env.Store.ReservationAudit(ctx, "n1", "r1", capacity.ChainCalls, 2, c)
			return err
		}},
		{"node changes chain", func(c string) error {
			_, _, _, err := env.Store.NodeAudit(ctx, "n1", capacity.ChainChanges, 2, c)
			return err
		}},
		{"node calls chain", func(c string) error {
			_, _, _, err := env.Store.NodeAudit(ctx, "n1", capacity.ChainCalls, 2, c)
			return err
		}},
		{"key chain", func(c string) error {
			_, _, _, err := env.Store.KeyAudit(ctx, 2, c)
			return err
		}},
		{"scheduled reclaims", func(c string) error {
			_, _, err := env.Store.ListScheduled(ctx, "n1", "r1", 2, c)
			return err
		}},
	}
	forged := []struct{ name, cursor string }{
		{"garbage", "not a cursor"},
		{"not JSON", b64("hello")},
		{"another node's record", b64(`{"pk":"NODE#n2","sk":"SEQ#00000000000000000001"}`)},
		{"another node's index entry", b64(`{"pk":"NODE#n2","sk":"SEQ#00000000000000000001","resKey":"NODE#n2#RES#r1"}`)},
		{"another node's scheduled reclaim", b64(`{"pk":"NODE#n2#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n2#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`)},
		{"a record of another prefix", b64(`{"pk":"NODE#n1","sk":"RES#r1","resKey":"NODE#n1#RES#r1"}`)},
		{"a scheduled reclaim of another prefix", b64(`{"pk":"NODE#n1#OP#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1"}`)},
		{"an extra attribute", b64(`{"pk":"NODE#n1","sk":"SEQ#00000000000000000001","resKey":"NODE#n1#RES#r1","x":"y"}`)},
		{"a scheduled reclaim with an extra attribute", b64(`{"pk":"NODE#n1#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s1","x":"y"}`)},
		{"a scheduled reclaim whose index key names another", b64(`{"pk":"NODE#n1#SCHED#s1","sk":"SCHED","gsi1pk":"NODE#n1#RES#r1#SCHED","gsi1sk":"2026-01-02T03:04:05Z#s2"}`)},
	}
	for _, l := range lists {
		for _, f := range forged {
			t.Run(l.name+"/"+f.name, func(t *testing.T) {
				env.Calls.Reset()
				if err := l.read(f.cursor); capacity.ErrorCode(err) != capacity.CodeInvalidRequest {
					t.Fatalf("cursor %s: %v, want invalid_request", f.cursor, err)
				}
				if calls := env.Calls.Snapshot(); len(calls) != 0 {
					t.Errorf("read before refusing the cursor: %v", calls)
				}
			})
		}
	}
}
