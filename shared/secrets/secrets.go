// Package secrets reads a secret from AWS Secrets Manager at run time, with its rotation
// window: the AWSCURRENT version and, while it exists, the AWSPREVIOUS one. Values are cached
// for TTL, so a rotation reaches every function instance within TTL and needs no deploy.
package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
)

// Version stages Secrets Manager moves on rotation: PutSecretValue makes the new version
// AWSCURRENT and the one before it AWSPREVIOUS.
const (
	StageCurrent  = "AWSCURRENT"
	StagePrevious = "AWSPREVIOUS"
)

// Defaults of a Rotating.
const (
	DefaultTTL = 5 * time.Minute
	// DefaultMaxStale is how long a cached value is still served while Secrets Manager cannot
	// be read, so that a short outage does not stop every caller at once.
	DefaultMaxStale = time.Hour
	// retryAfter spaces out reads of Secrets Manager after a failed one.
	retryAfter = 10 * time.Second
)

// API is the part of the Secrets Manager client used.
type API interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// Rotating is a cached reader of one secret's current and previous values. Safe for concurrent
// use; set the fields before first use.
type Rotating struct {
	API      API
	SecretID string        // name or ARN
	TTL      time.Duration // 0: DefaultTTL
	MaxStale time.Duration // 0: DefaultMaxStale
	Now      func() time.Time

	mu        sync.Mutex
	current   []byte
	previous  [][]byte
	fetchedAt time.Time // zero: nothing cached
	failedAt  time.Time
	lastErr   error
}

// New returns a Rotating for the secret with the defaults.
func New(api API, secretID string) *Rotating { return &Rotating{API: api, SecretID: secretID} }

// Secrets returns the secret's AWSCURRENT value and its AWSPREVIOUS value if it has one (the
// agent package's MasterSecrets). It reads Secrets Manager when the cache is older than TTL;
// when that fails, it keeps serving the cached value up to MaxStale old and tries again at
// most every few seconds.
func (r *Rotating) Secrets(ctx context.Context) ([]byte, [][]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock() // held while reading: one read refreshes the cache for every caller
	now := r.now()
	age := now.Sub(r.fetchedAt)
	if !r.fetchedAt.IsZero() && age < r.ttl() {
		return r.current, r.previous, nil
	}
	if !r.failedAt.IsZero() && now.Sub(r.failedAt) < retryAfter {
		return r.stale(age, r.lastErr)
	}
	cur, prev, err := r.fetch(ctx)
	if err != nil {
		r.failedAt, r.lastErr = now, err
		return r.stale(age, err)
	}
	r.current, r.previous, r.fetchedAt, r.failedAt, r.lastErr = cur, prev, now, time.Time{}, nil
	return cur, prev, nil
}

// stale serves the cached value while it is younger than MaxStale, else err.
func (r *Rotating) stale(age time.Duration, err error) ([]byte, [][]byte, error) {
	maxStale := r.MaxStale
	if maxStale <= 0 {
		maxStale = DefaultMaxStale
	}
	if !r.fetchedAt.IsZero() && age < maxStale {
		return r.current, r.previous, nil
	}
	return nil, nil, err
}

func (r *Rotating) fetch(ctx context.Context) ([]byte, [][]byte, error) {
	cur, curVersion, err := r.get(ctx, StageCurrent)
	if err != nil {
		return nil, nil, err
	}
	prev, prevVersion, err := r.get(ctx, StagePrevious)
	var nf *types.ResourceNotFoundException
	switch {
	case errors.As(err, &nf): // never rotated: no previous version
		return cur, nil, nil
	case err != nil:
		// The current value was read: use it, and keep accepting what was cached (which, if
		// the secret has just rotated, holds the value now previous).
		return cur, r.cachedOtherThan(cur), nil
	case prevVersion == curVersion:
		return cur, nil, nil
	}
	return cur, [][]byte{prev}, nil
}

// cachedOtherThan returns the cached values other than cur. The caller holds r.mu.
func (r *Rotating) cachedOtherThan(cur []byte) [][]byte {
	var out [][]byte
	for _, v := range append([][]byte{r.current}, r.previous...) {
		if len(v) > 0 && !bytes.Equal(v, cur) {
			out = append(out, v)
		}
	}
	return out
}

// get reads one version stage: its value (SecretString, else SecretBinary) and version id.
func (r *Rotating) get(ctx context.Context, stage string) ([]byte, string, error) {
	out, err := r.API.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{
		SecretId:     aws.String(r.SecretID),
		VersionStage: aws.String(stage),
	})
	if err != nil {
		return nil, "", fmt.Errorf("read secret %s (%s): %w", r.SecretID, stage, err)
	}
	v := out.SecretBinary
	if out.SecretString != nil {
		v = []byte(*out.SecretString)
	}
	if len(v) == 0 {
		return nil, "", fmt.Errorf("read secret %s (%s): empty value", r.SecretID, stage)
	}
	return v, aws.ToString(out.VersionId), nil
}

func (r *Rotating) ttl() time.Duration {
	if r.TTL > 0 {
		return r.TTL
	}
	return DefaultTTL
}

func (r *Rotating) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
