package agent

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Signature headers. The signature covers the method, the path as sent, the timestamp, the
// nonce and the body, so none of them can be changed, and the timestamp and nonce keep a
// captured request from being sent again (see Verifier).
const (
	HeaderTimestamp = "X-Agent-Timestamp" // unix seconds, decimal
	HeaderNonce     = "X-Agent-Nonce"     // 16 random bytes, hex
	HeaderSignature = "X-Agent-Signature" // "v1=" + hex HMAC-SHA256 of the canonical string

	signaturePrefix = "v1="
	nonceBytes      = 16
)

// Sign sets the signature headers on r for the given body (nil for none), signing with secret
// at time now. The path signed is r.URL.EscapedPath(), which is what the client sends.
func Sign(r *http.Request, secret, body []byte, now time.Time) error {
	if len(secret) == 0 {
		return errors.New("sign agent request: empty secret")
	}
	var n [nonceBytes]byte
	// crypto/rand.Read never fails on supported platforms (it crashes instead).
	_, _ = rand.Read(n[:])
	ts := strconv.FormatInt(now.Unix(), 10)
	nonce := hex.EncodeToString(n[:])
	r.Header.Set(HeaderTimestamp, ts)
	r.Header.Set(HeaderNonce, nonce)
	r.Header.Set(HeaderSignature, signaturePrefix+hex.EncodeToString(
		mac(secret, r.Method, r.URL.EscapedPath(), ts, nonce, body)))
	return nil
}

// mac is HMAC-SHA256(secret, METHOD "\n" PATH "\n" timestamp "\n" nonce "\n" hex(SHA-256(body))).
// Hashing the body first keeps the canonical string small and unambiguous: no field but the
// hash can contain arbitrary bytes, and the others cannot contain "\n" (headers and escaped
// paths cannot).
func mac(secret []byte, method, path, ts, nonce string, body []byte) []byte {
	bh := sha256.Sum256(body)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(method + "\n" + path + "\n" + ts + "\n" + nonce + "\n" + hex.EncodeToString(bh[:])))
	return m.Sum(nil)
}
