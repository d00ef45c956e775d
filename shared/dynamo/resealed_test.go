package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// TestResealedAgentKey: the terminating function's store puts a node's resealed agent key and
// reads it back with the node, in the same Query; a later generation's is never replaced by an
// earlier one's. The api function's store reads the node as if it were not there, and the
// node as it answers it (JSON) never holds it.
func TestResealedAgentKey(t *testing.T) {
	ctx := context.Background()
	env := newEnv(t, seed(4, 2))
	api := env.Store
	own := *env.Store
	own.ReadResealedAgentKeys = true
	before, err := api.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		put     capacity.ResealedAgentKey
		wantErr error // nil: stored
		wantGen int64 // stored after the step
	}{
		{"first", capacity.ResealedAgentKey{Gen: 2, Sealed: []byte("gen-2"), At: t0}, nil, 2},
		{"the same generation again (the master secret rotated)", capacity.ResealedAgentKey{Gen: 2, Sealed: []byte("gen-2b"), At: t0}, nil, 2},
		{"a later generation", capacity.ResealedAgentKey{Gen: 3, Sealed: []byte("gen-3"), At: t0}, nil, 3},
		{"an earlier one, read before the rotation", capacity.ResealedAgentKey{Gen: 2, Sealed: []byte("gen-2"), At: t0}, capacity.ErrConflict, 3},
	}
	for _, s := range steps {
		err := own.PutResealedAgentKey(ctx, "n1", s.put)
		if s.wantErr == nil && err != nil || s.wantErr != nil && !errors.Is(err, s.wantErr) {
			t.Fatalf("%s: put = %v, want %v", s.name, err, s.wantErr)
		}
		env.Calls.Reset()
		c, stats := capacity.WithCallStats(ctx)
		st, err := own.LoadNode(c, "n1", "")
		if err != nil {
			t.Fatal(err)
		}
		if r := st.Node.ResealedAgentKey; r == nil || r.Gen != s.wantGen || !t0.Equal(r.At) {
			t.Fatalf("%s: read %+v, want generation %d", s.name, r, s.wantGen)
		}
		if calls := env.Calls.Snapshot(); len(calls) != 1 || calls["Query"] != 1 || stats.Snapshot().ItemsRead != 5 {
			t.Errorf("%s: %v, %d items read; want the node, its reservation, 2 VMs and the resealed key in one Query", s.name, calls, stats.Snapshot().ItemsRead)
		}
	}
	after, err := api.LoadNode(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if after.Node.ResealedAgentKey != nil || len(after.VMs) != len(before.VMs) || len(after.Reservations) != len(before.Reservations) {
		t.Errorf("the api's read: %+v, want the node as before %+v", after, before)
	}
	st, _ := own.LoadNode(ctx, "n1", "")
	out, err := json.Marshal(st.Node)
	if err != nil || bytes.Contains(out, []byte("gen-3")) || bytes.Contains(out, []byte("Resealed")) {
		t.Errorf("node JSON %s holds the resealed key", out)
	}
	for _, bad := range []capacity.ResealedAgentKey{{Gen: 0, Sealed: []byte("x")}, {Gen: 1}} {
		if err := own.PutResealedAgentKey(ctx, "n1", bad); err == nil {
			t.Errorf("put %+v succeeded", bad)
		}
	}
}
