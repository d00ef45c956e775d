package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// The emulator enforces no IAM: these tests inject the AccessDeniedException AWS answers when
// a function's role lacks a permission, and check that the call changes nothing and fails
// clearly (or, where the write is a side effect, that the answer does not depend on it).

// logBuffer collects slog JSON lines written from any goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the logged records with message msg.
func (l *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// tables returns every item of the env's three tables, for before/after comparisons.
func tables(t *testing.T, env *dynamotest.Env) map[string][]map[string]types.AttributeValue {
	t.Helper()
	out := map[string][]map[string]types.AttributeValue{}
	for _, name := range []string{env.Store.Table, env.Store.AuditTable, env.Store.KeysTable} {
		out[name] = env.Items(t, name)
	}
	return out
}

// denied is an env seeded with s whose store's every call of operation is refused with
// AccessDeniedException, as IAM refuses a role without the action; the injector counts them.
func denied(t *testing.T, seed int64, operation string, s dynamo.Seed) (*dynamotest.Env, *awsfault.Injector) {
	t.Helper()
	inj := awsfault.New(seed, awsfault.Rule{Operation: operation, Fault: awsfault.AccessDenied, Rate: 1})
	env := dynamotest.New(t, dynamotest.WithAPIOptions(inj.APIOption))
	if err := env.Store.Put(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return env, inj
}

// Creating a key whose role may not write the keys table (or read its idempotency record)
// answers internal at once (a refusal is not retried, by the SDK or by another round), hands
// out no secret, and leaves the keys, audit and state tables as they were.
func TestCreateKeyAccessDenied(t *testing.T) {
	tests := []struct {
		name      string
		operation string
		idemKey   string
		denials   int // one per request the refused step sends
	}{
		{"transaction denied", "TransactWriteItems", "i1", 1},
		{"transaction denied, no idempotency key", "TransactWriteItems", "", 1},
		// The record and its legacy scope are read together.
		{"idempotency read denied", "GetItem", "i1", 2},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := seed(2, 1)
			s.Keys = []capacity.APIKey{operatorKey}
			env, inj := denied(t, int64(n), tt.operation, s)
			before := tables(t, env)
			var logs logBuffer
			svc := keyService(env, t0)
			svc.Logger = logs.logger()
			res, err := svc.CreateKey(context.Background(), opPrincipal,
				capacity.KeyRequest{OrgID: "org-1", Permissions: []string{capacity.PermRead}, IdempotencyKey: tt.idemKey}, capacity.RequestMeta{})
			if res != nil {
				t.Errorf("answered %+v (secret %q) with the refusal", res.Key, res.Secret)
			}
			if err == nil || capacity.ErrorCode(err) != capacity.CodeInternal || !strings.Contains(err.Error(), "AccessDeniedException") {
				t.Fatalf("err = %v (code %s), want internal naming AccessDeniedException", err, capacity.ErrorCode(err))
			}
			if got := inj.Count(awsfault.AccessDenied); got != tt.denials {
				t.Errorf("refused %d times, want %d: a refusal is neither retried nor tried again", got, tt.denials)
			}
			if retried := logs.lines(t, "key creation did not land; trying again"); len(retried) != 0 {
				t.Errorf("went another round after a refusal: %v", retried)
			}
			if after := tables(t, env); !reflect.DeepEqual(before, after) {
				t.Errorf("tables changed by a refused create:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// Recording a key's last use with a role that may not update the keys table: the key still
// authenticates, the failure is logged with the key and the error, and LastUsedAt is not set.
func TestTouchKeyAccessDenied(t *testing.T) {
	env, inj := denied(t, 1, "UpdateItem", dynamo.Seed{Keys: []capacity.APIKey{operatorKey}})
	ctx := context.Background()
	before := tables(t, env)
	var logs logBuffer
	a := &auth.Authenticator{Keys: env.Store.Keys(), Touch: env.Store.Keys(), Now: func() time.Time { return t0 }, Logger: logs.logger()}
	p, err := a.Authenticate(ctx, "Bearer "+capacity.FixedKeySecret("op"))
	if err != nil || p.KeyID != operatorKey.KeyID || !p.Operator {
		t.Fatalf("authenticate = %+v, %v; want the operator key", p, err)
	}
	// The recording runs after the answer: wait for its log line.
	const msg = "recording the API key's last use failed"
	deadline := time.Now().Add(5 * time.Second)
	var logged []map[string]any
	for logged = logs.lines(t, msg); len(logged) == 0; logged = logs.lines(t, msg) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged", msg)
		}
		time.Sleep(time.Millisecond)
	}
	if l := logged[0]; l["level"] != "WARN" || l["key_id"] != operatorKey.KeyID || !strings.Contains(fmt.Sprint(l["err"]), "AccessDeniedException") {
		t.Errorf("logged %v, want a warning with the key id and AccessDeniedException", l)
	}
	if got := inj.Count(awsfault.AccessDenied); got != 1 {
		t.Errorf("refused %d times, want 1 (not retried)", got)
	}
	if got := lastUsed(t, env, operatorKey.Hash); got != 0 {
		t.Errorf("LastUsedAt = %d after a refused touch, want none", got)
	}
	if after := tables(t, env); !reflect.DeepEqual(before, after) {
		t.Errorf("tables changed by a refused touch:\nbefore %v\nafter  %v", before, after)
	}
}

// A dry run whose audit append the role may not write still answers the plan (the append is
// logged, as every failed append outside a commit is), and the node's chain is unchanged.
func TestDryRunAuditAppendAccessDenied(t *testing.T) {
	env, inj := denied(t, 1, "TransactWriteItems", seed(4, 2))
	ctx := context.Background()
	req := capacity.CapacityRequest{NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}, DryRun: true}
	// One dry run with the permission, so that the chain has a head to keep.
	allowed := auditService(env.Clean())
	want, err := allowed.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	head, recs, rep := wholeChain(t, allowed, "n1", capacity.ChainCalls)
	if !rep.OK || head.Seq != 1 || len(recs) != 1 {
		t.Fatalf("chain after the allowed dry run: %+v, head %+v, %d records", rep, head, len(recs))
	}
	before := tables(t, env)

	var logs logBuffer
	denied := auditService(env.Store)
	denied.Logger = logs.logger()
	got, err := denied.Reclaim(ctx, auditOwner, req, capacity.RequestMeta{})
	if err != nil {
		t.Fatalf("dry run with its append denied: %v, want the plan", err)
	}
	if !got.DryRun || !slices.Equal(got.Terminated, want.Terminated) || len(got.Terminated) != 1 ||
		got.PlanETag == "" || got.PlanETag != want.PlanETag {
		t.Errorf("answer %+v, want the plan %+v", got, want)
	}
	if got := inj.Count(awsfault.AccessDenied); got != 1 {
		t.Errorf("refused %d times, want 1 (not retried)", got)
	}
	logged := logs.lines(t, "audit append failed")
	if len(logged) != 1 || logged[0]["level"] != "ERROR" || logged[0]["action"] != capacity.ActionReclaim ||
		!strings.Contains(fmt.Sprint(logged[0]["err"]), "AccessDeniedException") {
		t.Errorf("logged %v, want one error naming the action and AccessDeniedException", logged)
	}
	if h, recs, rep := wholeChain(t, allowed, "n1", capacity.ChainCalls); !rep.OK || h != head || len(recs) != 1 {
		t.Errorf("chain after the denied append: %+v, head %+v (want %+v), %d records", rep, h, head, len(recs))
	}
	if after := tables(t, env); !reflect.DeepEqual(before, after) {
		t.Errorf("tables changed by a denied append:\nbefore %v\nafter  %v", before, after)
	}
}
