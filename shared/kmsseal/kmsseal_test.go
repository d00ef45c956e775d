package kmsseal

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/sivchari/kumo"
)

// emulator starts KMS in process, creates a key and returns a client and the key id.
func emulator(t *testing.T) (*kms.Client, string) {
	t.Helper()
	srv := kumo.NewServer()
	t.Cleanup(srv.Close)
	c := kms.New(kms.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	out, err := c.CreateKey(context.Background(), &kms.CreateKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	return c, aws.ToString(out.KeyMetadata.KeyId)
}

// counting counts Decrypt calls.
type counting struct {
	API
	decrypts atomic.Int32
}

func (c *counting) Decrypt(ctx context.Context, in *kms.DecryptInput, opts ...func(*kms.Options)) (*kms.DecryptOutput, error) {
	c.decrypts.Add(1)
	return c.API.Decrypt(ctx, in, opts...)
}

// TestSealBindsTheNode: a sealed key opens for its node only, whether it is opened afresh or
// from the cache, and the emulator (which ignores the encryption context) does not change that.
func TestSealBindsTheNode(t *testing.T) {
	client, keyID := emulator(t)
	ctx := context.Background()
	sealer := New(client, keyID)
	key := bytes.Repeat([]byte{7}, 32)
	sealed, err := sealer.SealAgentKey(ctx, "node-a", key)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, key) {
		t.Fatal("the sealed form holds the key in clear")
	}
	tests := []struct {
		name   string
		opener *Sealer
		node   string
		want   error
	}{
		{"its node", New(client, keyID), "node-a", nil},
		{"its node, cached", sealer, "node-a", nil},
		{"another node", New(client, keyID), "node-b", ErrOtherNode},
		{"a node whose id extends it", New(client, keyID), "node-a\nx", ErrOtherNode},
	}
	// Open on the sealer first, so that "cached" is one.
	if _, err := sealer.OpenAgentKey(ctx, "node-a", sealed); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.opener.OpenAgentKey(ctx, tc.node, sealed)
			if !errors.Is(err, tc.want) {
				t.Fatalf("open for %q: %v, want %v", tc.node, err, tc.want)
			}
			if tc.want == nil && !bytes.Equal(got, key) {
				t.Fatalf("opened %x, want %x", got, key)
			}
		})
	}
	// The cache answers a node id other than the one it was opened for with the refusal too.
	if _, err := sealer.OpenAgentKey(ctx, "node-b", sealed); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("cached key opened for another node: %v", err)
	}
}

// TestOpenIsCached: the terminating function opens a node's key once, not once per round.
func TestOpenIsCached(t *testing.T) {
	client, keyID := emulator(t)
	ctx := context.Background()
	api := &counting{API: client}
	s := New(api, keyID)
	sealed, err := s.SealAgentKey(ctx, "n1", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.OpenAgentKey(ctx, "n1", sealed); err != nil {
			t.Fatal(err)
		}
	}
	if n := api.decrypts.Load(); n != 1 {
		t.Fatalf("%d Decrypt calls for one sealed key, want 1", n)
	}
}

// TestSealRefusesBadInput: no KMS call for an empty key or a malformed node id.
func TestSealRefusesBadInput(t *testing.T) {
	client, keyID := emulator(t)
	s := New(client, keyID)
	for _, tc := range []struct {
		node string
		key  []byte
	}{{"n1", nil}, {"", []byte("k")}, {"a/b", []byte("k")}} {
		if _, err := s.SealAgentKey(context.Background(), tc.node, tc.key); err == nil {
			t.Errorf("seal(%q, %q) succeeded", tc.node, tc.key)
		}
	}
	if _, err := s.OpenAgentKey(context.Background(), "n1", nil); err == nil {
		t.Error("opened nothing")
	}
}
