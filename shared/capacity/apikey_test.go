package capacity_test

import (
	"hash/crc32"
	"strings"
	"testing"
	"testing/quick"

	"github.com/openrelay/capacity/shared/capacity"
)

// A fixed secret in the format, its checksum computed independently of the package's code.
func goodSecret(t *testing.T) string {
	t.Helper()
	body := capacity.KeyPrefix + strings.Repeat("a", 42) + "B"
	sum := crc32.ChecksumIEEE([]byte(body))
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	var check [6]byte
	for i := 5; i >= 0; i-- {
		check[i] = alphabet[sum%62]
		sum /= 62
	}
	s := body + string(check[:])
	if err := capacity.CheckKeySecret(s); err != nil {
		t.Fatalf("CheckKeySecret(%q) = %v, want nil", s, err)
	}
	return s
}

func TestCheckKeySecret(t *testing.T) {
	good := goodSecret(t)
	swap := func(s string, i int) string {
		b := []byte(s)
		b[i], b[i+1] = b[i+1], b[i]
		return string(b)
	}
	change := func(s string, i int, c byte) string {
		b := []byte(s)
		b[i] = c
		return string(b)
	}
	tests := []struct {
		name   string
		secret string
		ok     bool
	}{
		{"well formed", good, true},
		{"one random char changed", change(good, 10, 'b'), false},
		{"one checksum char changed", change(good, len(good)-1, good[len(good)-1]^1), false},
		{"adjacent chars swapped", swap(good, 46), false}, // 'a','B'
		{"truncated by one", good[:len(good)-1], false},
		{"one char too many", good + "a", false},
		{"checksum missing", good[:len(good)-6], false},
		{"wrong prefix", "ocop_" + good[5:], false},
		{"upper-case prefix", strings.ToUpper(capacity.KeyPrefix) + good[5:], false},
		{"legacy prefix", "ork_" + good[5:], false},
		{"no prefix", good[5:], false},
		{"character outside base62", change(good, 20, '-'), false},
		{"non-ASCII character", good[:20] + "é" + good[22:], false},
		{"empty", "", false},
		{"prefix only", capacity.KeyPrefix, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := capacity.CheckKeySecret(tt.secret)
			if (err == nil) != tt.ok {
				t.Errorf("CheckKeySecret(%q) = %v, want ok=%v", tt.secret, err, tt.ok)
			}
		})
	}
}

// Every generated secret is well formed, unique, and any single-character change to it is
// refused.
func TestNewKeySecretAlwaysChecks(t *testing.T) {
	seen := map[string]bool{}
	prop := func(pos uint8, delta uint8) bool {
		s, err := capacity.NewKeySecret()
		if err != nil || seen[s] {
			t.Logf("secret %q err %v (seen: %v)", s, err, seen[s])
			return false
		}
		seen[s] = true
		if len(s) != 54 || !strings.HasPrefix(s, capacity.KeyPrefix) || capacity.CheckKeySecret(s) != nil {
			t.Logf("secret %q does not check: %v", s, capacity.CheckKeySecret(s))
			return false
		}
		// CRC32 detects every single-character change.
		const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
		i := len(capacity.KeyPrefix) + int(pos)%(len(s)-len(capacity.KeyPrefix))
		c := alphabet[(strings.IndexByte(alphabet, s[i])+1+int(delta)%61)%62]
		typo := s[:i] + string(c) + s[i+1:]
		if capacity.CheckKeySecret(typo) == nil {
			t.Logf("typo %q of %q passes", typo, s)
			return false
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
}

func TestHashKeySecret(t *testing.T) {
	if got, want := capacity.HashKeySecret("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("HashKeySecret(abc) = %s, want %s", got, want)
	}
}
