package secrets

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/capacitytest"
)

// emulator starts Secrets Manager in process and returns a client of it.
func emulator(t *testing.T) *secretsmanager.Client {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	return secretsmanager.New(secretsmanager.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// counting counts GetSecretValue calls and fails them while fail is set.
type counting struct {
	API
	calls atomic.Int32
	fail  atomic.Bool
}

func (c *counting) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return nil, errors.New("ThrottlingException: rate exceeded")
	}
	return c.API.GetSecretValue(ctx, in, opts...)
}

// name is a secret name no other test uses: the emulator keeps secrets process-wide.
func name(t *testing.T) string {
	return fmt.Sprintf("capacity/test/%s-%d", t.Name(), seq.Add(1))
}

var seq atomic.Int64

const (
	v1 = "master-v1-0123456789abcdef0123456789abcdef"
	v2 = "master-v2-0123456789abcdef0123456789abcdef"
)

// TestRotatingFollowsARotationWithinTTL: the value is cached for TTL; after an operator puts a
// new value, callers get it as current and the old one as previous within TTL, with no deploy.
func TestRotatingFollowsARotationWithinTTL(t *testing.T) {
	ctx := context.Background()
	sm := emulator(t)
	created, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name(t)), SecretString: aws.String(v1)})
	if err != nil {
		t.Fatal(err)
	}
	api := &counting{API: sm}
	clk := capacitytest.NewClock(time.Unix(1_760_000_000, 0))
	r := &Rotating{API: api, SecretID: aws.ToString(created.ARN), Now: clk.Now}

	expect := func(step, cur string, prev ...string) {
		t.Helper()
		c, p, err := r.Secrets(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if string(c) != cur || len(p) != len(prev) {
			t.Fatalf("%s: current %q, previous %q; want %q, %q", step, c, p, cur, prev)
		}
		for i := range prev {
			if string(p[i]) != prev[i] {
				t.Fatalf("%s: previous %q, want %q", step, p, prev)
			}
		}
	}
	expect("never rotated", v1)
	if n := api.calls.Load(); n != 2 {
		t.Fatalf("first read made %d calls, want 2 (AWSCURRENT, AWSPREVIOUS)", n)
	}
	if _, err := sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: created.ARN, SecretString: aws.String(v2)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(DefaultTTL - time.Second)
	expect("rotated, within the cache's TTL", v1)
	if n := api.calls.Load(); n != 2 {
		t.Fatalf("cached read made calls: %d in all", n)
	}
	clk.Advance(2 * time.Second)
	expect("rotated, after the TTL", v2, v1)

}

func TestRotatingServesStaleValueDuringAnOutage(t *testing.T) {
	ctx := context.Background()
	sm := emulator(t)
	id := name(t)
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(id), SecretString: aws.String(v1)}); err != nil {
		t.Fatal(err)
	}
	api := &counting{API: sm}
	clk := capacitytest.NewClock(time.Unix(1_760_000_000, 0))
	r := &Rotating{API: api, SecretID: id, Now: clk.Now}
	if _, _, err := r.Secrets(ctx); err != nil {
		t.Fatal(err)
	}
	api.fail.Store(true)
	clk.Advance(DefaultTTL + time.Second)
	before := api.calls.Load()
	for range 5 {
		if c, _, err := r.Secrets(ctx); err != nil || string(c) != v1 {
			t.Fatalf("during an outage: %q, %v; want the cached value", c, err)
		}
	}
	if n := api.calls.Load() - before; n != 1 {
		t.Fatalf("5 reads during an outage made %d calls, want 1 (then a pause)", n)
	}
	clk.Advance(DefaultMaxStale)
	if _, _, err := r.Secrets(ctx); err == nil {
		t.Fatal("a value older than MaxStale was served")
	}
	api.fail.Store(false)
	clk.Advance(retryAfter)
	if c, _, err := r.Secrets(ctx); err != nil || string(c) != v1 {
		t.Fatalf("after the outage: %q, %v", c, err)
	}
}

func TestRotatingErrors(t *testing.T) {
	ctx := context.Background()
	sm := emulator(t)
	if _, _, err := (&Rotating{API: sm, SecretID: name(t)}).Secrets(ctx); err == nil {
		t.Fatal("a missing secret read without error")
	}

}

// failPrevious fails reads of AWSPREVIOUS only.
type failPrevious struct{ API }

func (f failPrevious) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	if aws.ToString(in.VersionStage) == StagePrevious {
		return nil, errors.New("ThrottlingException: rate exceeded")
	}
	return f.API.GetSecretValue(ctx, in, opts...)
}

// A failed read of AWSPREVIOUS does not cost the current value: it is served, and what was
// cached (the value that just became previous) is still accepted.
func TestRotatingKeepsCurrentWhenPreviousCannotBeRead(t *testing.T) {
	ctx := context.Background()
	sm := emulator(t)
	created, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name(t)), SecretString: aws.String(v1)})
	if err != nil {
		t.Fatal(err)
	}
	clk := capacitytest.NewClock(time.Unix(1_760_000_000, 0))
	r := &Rotating{API: sm, SecretID: aws.ToString(created.ARN), Now: clk.Now}
	if _, _, err := r.Secrets(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: created.ARN, SecretString: aws.String(v2)}); err != nil {
		t.Fatal(err)
	}
	r.API = failPrevious{sm}
	clk.Advance(DefaultTTL + time.Second)
	cur, prev, err := r.Secrets(ctx)
	if err != nil || string(cur) != v2 || len(prev) != 1 || string(prev[0]) != v1 {
		t.Fatalf("current %q, previous %q, err %v; want %q, [%q]", cur, prev, err, v2, v1)
	}
}
