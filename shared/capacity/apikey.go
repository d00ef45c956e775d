package capacity

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math/big"
	"strings"
)

// API key secrets look like ocap_<43 base62 chars><6 base62 chars>: the prefix lets secret
// scanners recognise a leaked key, the 43 characters carry 256 random bits, and the last six
// are the CRC32 (IEEE) of everything before them, so a mistyped key is refused without a
// table read. It is the only format accepted: the unchecksummed ork_ keys of before are
// refused without a read (a junk bearer of any format costs no table read), and must be
// reissued.
const (
	// KeyPrefix starts every API key secret.
	KeyPrefix = "ocap_"

	keyRandomLen = 43 // 62^43 > 2^256
	keyCheckLen  = 6  // 62^6 > 2^32
	keySecretLen = len(KeyPrefix) + keyRandomLen + keyCheckLen
	base62       = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// NewKeySecret returns a new API key secret: 256 random bits from crypto/rand, in the format
// above.
func NewKeySecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new key secret: %w", err)
	}
	body := KeyPrefix + encodeBase62(new(big.Int).SetBytes(b[:]), keyRandomLen)
	return body + keyChecksum(body), nil
}

// FixedKeySecret returns the well-formed secret whose random part is name padded with '0':
// for the local stack's published demo keys and for tests only, never for a real key (it
// is not secret). name must be 1 to 43 characters of [0-9A-Za-z]; anything else panics.
func FixedKeySecret(name string) string {
	if name == "" || len(name) > keyRandomLen || strings.IndexFunc(name, func(r rune) bool { return !strings.ContainsRune(base62, r) }) >= 0 {
		panic(fmt.Sprintf("FixedKeySecret(%q): want 1 to %d characters of [0-9A-Za-z]", name, keyRandomLen))
	}
	body := KeyPrefix + name + strings.Repeat("0", keyRandomLen-len(name))
	return body + keyChecksum(body)
}

// CheckKeySecret returns nil for a well-formed ocap_ secret (prefix, length, alphabet and
// checksum), and an error saying what is wrong otherwise. It says nothing about whether the
// key exists.
func CheckKeySecret(s string) error {
	rest, ok := strings.CutPrefix(s, KeyPrefix)
	if !ok {
		return fmt.Errorf("API key does not start with %s", KeyPrefix)
	}
	if len(s) != keySecretLen {
		return fmt.Errorf("API key has %d characters, want %d", len(s), keySecretLen)
	}
	if i := strings.IndexFunc(rest, func(r rune) bool { return !strings.ContainsRune(base62, r) }); i >= 0 {
		return fmt.Errorf("API key has a character outside [0-9A-Za-z] at %d", len(KeyPrefix)+i)
	}
	body, sum := s[:len(s)-keyCheckLen], s[len(s)-keyCheckLen:]
	if keyChecksum(body) != sum {
		return errKeyChecksum
	}
	return nil
}

var errKeyChecksum = errors.New("API key checksum does not match: mistyped or truncated")

// HashKeySecret returns the stored form of a key secret: hex SHA-256. Secrets carry 256
// random bits, so an unsalted fast hash is enough and a lookup stays one GetItem.
func HashKeySecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// keyChecksum is the CRC32 (IEEE) of s in base62, zero-padded to keyCheckLen.
func keyChecksum(s string) string {
	return encodeBase62(new(big.Int).SetUint64(uint64(crc32.ChecksumIEEE([]byte(s)))), keyCheckLen)
}

// encodeBase62 writes n in base62, most significant first, zero-padded to width (n must fit).
func encodeBase62(n *big.Int, width int) string {
	out := make([]byte, width)
	base, mod := big.NewInt(62), new(big.Int)
	n = new(big.Int).Set(n)
	for i := width - 1; i >= 0; i-- {
		n.DivMod(n, base, mod)
		out[i] = base62[mod.Int64()]
	}
	return string(out)
}
