package capacity

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// NewID returns 128 random bits as lower-case base32, safe in keys and URLs.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}
