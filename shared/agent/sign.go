package agent

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Signature headers. A request carries all four; an answer carries the timestamp and the
// signature (its nonce is the request's).
const (
	HeaderNode      = "X-Agent-Node"      // the node the request is for
	HeaderTimestamp = "X-Agent-Timestamp" // unix seconds, decimal
	HeaderNonce     = "X-Agent-Nonce"     // 16 random bytes, hex
	HeaderSignature = "X-Agent-Signature" // "v2=" + hex HMAC-SHA256 of the canonical string

	signaturePrefix = "v2="
	nonceBytes      = 16

	// Labels that open the canonical strings, so a request's signature can never pass for an
	// answer's, nor a v1 signature for either.
	requestLabel = "capacity-agent-v2 request"
	answerLabel  = "capacity-agent-v2 answer"
)

// Sign sets the signature headers on r, a request for node nodeID's agent with the given body
// (nil for none), signing with that node's key at time now. The path signed is
// r.URL.EscapedPath(), which is what the client sends.
func Sign(r *http.Request, nodeID string, key, body []byte, now time.Time) error {
	if len(key) == 0 {
		return errors.New("sign agent request: empty key")
	}
	if !ValidNodeID(nodeID) {
		return fmt.Errorf("sign agent request: invalid node id %q", nodeID)
	}
	var n [nonceBytes]byte
	// crypto/rand.Read never fails on supported platforms (it crashes instead).
	_, _ = rand.Read(n[:])
	ts := strconv.FormatInt(now.Unix(), 10)
	nonce := hex.EncodeToString(n[:])
	r.Header.Set(HeaderNode, nodeID)
	r.Header.Set(HeaderTimestamp, ts)
	r.Header.Set(HeaderNonce, nonce)
	r.Header.Set(HeaderSignature, signaturePrefix+hex.EncodeToString(
		requestMAC(key, nodeID, r.Method, r.URL.EscapedPath(), ts, nonce, body)))
	return nil
}

// SignAnswer sets the signature headers of an answer of node nodeID's agent to the request
// with the given nonce: status, body, timestamp now, signed with key.
func SignAnswer(h http.Header, nodeID string, key []byte, status int, nonce string, body []byte, now time.Time) {
	ts := strconv.FormatInt(now.Unix(), 10)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, signaturePrefix+hex.EncodeToString(answerMAC(key, nodeID, status, nonce, ts, body)))
}

// VerifyAnswer checks an answer's signature headers: signed with one of keys, for node nodeID,
// status and body, and the request's nonce, at most maxSkew from now. Every refusal wraps
// ErrUnsigned, ErrBadSignature or ErrStale.
func VerifyAnswer(h http.Header, nodeID string, keys [][]byte, status int, nonce string, body []byte, now time.Time, maxSkew time.Duration) error {
	ts, sig := h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if ts == "" || sig == "" {
		return fmt.Errorf("%w: answer lacks %s or %s", ErrUnsigned, HeaderTimestamp, HeaderSignature)
	}
	sec, err := parseTimestamp(ts)
	if err != nil {
		return fmt.Errorf("%w: answer's %s: %v", ErrBadSignature, HeaderTimestamp, err)
	}
	got, err := parseSignature(sig)
	if err != nil {
		return fmt.Errorf("%w: answer's %s: %v", ErrBadSignature, HeaderSignature, err)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > maxSkew || d < -maxSkew {
		return fmt.Errorf("%w: answer's timestamp %s is %s from now, more than %s", ErrStale, ts, d.Truncate(time.Second), maxSkew)
	}
	if matchKey(keys, got, func(k []byte) []byte { return answerMAC(k, nodeID, status, nonce, ts, body) }) < 0 {
		return fmt.Errorf("%w: answer is not signed by node %q's agent", ErrBadSignature, nodeID)
	}
	return nil
}

// requestMAC is HMAC-SHA256(key, requestLabel "\n" node "\n" METHOD "\n" PATH "\n" timestamp
// "\n" nonce "\n" hex(SHA-256(body))). The node id is path-escaped and the body hashed, so no
// field can contain "\n" and the string is unambiguous (headers and escaped paths cannot).
func requestMAC(key []byte, nodeID, method, path, ts, nonce string, body []byte) []byte {
	return macOf(key, requestLabel, url.PathEscape(nodeID), method, path, ts, nonce, bodyHash(body))
}

// answerMAC is HMAC-SHA256(key, answerLabel "\n" node "\n" status "\n" request nonce "\n"
// timestamp "\n" hex(SHA-256(body))).
func answerMAC(key []byte, nodeID string, status int, nonce, ts string, body []byte) []byte {
	return macOf(key, answerLabel, url.PathEscape(nodeID), strconv.Itoa(status), nonce, ts, bodyHash(body))
}

func macOf(key []byte, fields ...string) []byte {
	m := hmac.New(sha256.New, key)
	for i, f := range fields {
		if i > 0 {
			m.Write([]byte{'\n'})
		}
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

func bodyHash(body []byte) string {
	h := sha256.Sum256(body)
	return hex.EncodeToString(h[:])
}

// matchKey returns the index of the first key whose MAC equals got, or -1. Every key is tried,
// so the time taken does not depend on which one matched. Empty keys never match: anyone could
// compute their MACs.
func matchKey(keys [][]byte, got []byte, macFor func([]byte) []byte) int {
	match := -1
	for i, k := range keys {
		if len(k) == 0 {
			continue
		}
		if hmac.Equal(got, macFor(k)) && match < 0 {
			match = i
		}
	}
	return match
}
