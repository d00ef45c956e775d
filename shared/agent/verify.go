package agent

import (
	"bytes"
	"container/heap"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of a Verifier.
const (
	DefaultMaxSkew      = 5 * time.Minute
	DefaultMaxNonces    = 65536
	DefaultMaxBodyBytes = 64 << 10
)

// Reasons Verify refuses a request. Every refusal wraps exactly one of them; the middleware
// answers 401 to all of them.
var (
	ErrUnsigned     = errors.New("request is not signed")
	ErrBadSignature = errors.New("signature does not match")
	ErrStale        = errors.New("timestamp outside the allowed skew")
	ErrReplayed     = errors.New("nonce already used")
	ErrNoSecret     = errors.New("verifier has no secret")
)

// Verifier checks request signatures on the agent's side. It accepts a request signed with
// any of Secrets (so a secret can be rotated: list the new one and the old one until every
// signer uses the new one), at most MaxSkew from now, whose nonce it has not seen within the
// skew window.
//
// Nonces are remembered in memory, per Verifier: agents behind one endpoint that do not share
// a Verifier do not share replay protection. The cache holds at most MaxNonces entries; when a
// flood of validly signed requests fills it, the oldest nonce is forgotten and every timestamp
// up to and including its timestamp is refused from then on, so a forgotten nonce can never be
// replayed (the window shrinks instead of opening).
//
// Set the fields before first use; the zero values of the others mean their defaults.
type Verifier struct {
	Secrets      [][]byte
	MaxSkew      time.Duration
	MaxNonces    int
	MaxBodyBytes int64
	Now          func() time.Time
	// Logger, if set, gets one line per refused request, with the reason.
	Logger *slog.Logger

	mu    sync.Mutex
	seen  map[string]int64 // nonce -> timestamp (unix seconds)
	order nonceHeap        // the same entries, oldest timestamp first
	floor int64            // timestamps <= floor are refused; 0 until the cache overflows
}

// NewVerifier returns a Verifier with the given secrets and the defaults.
func NewVerifier(secrets ...[]byte) *Verifier { return &Verifier{Secrets: secrets} }

// Verify checks r's signature headers against body, the request's whole body, and records the
// nonce when they are valid. It does not read r.Body.
func (v *Verifier) Verify(r *http.Request, body []byte) error {
	ts, nonce, sig := r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderNonce), r.Header.Get(HeaderSignature)
	if ts == "" || nonce == "" || sig == "" {
		return fmt.Errorf("%w: missing %s, %s or %s", ErrUnsigned, HeaderTimestamp, HeaderNonce, HeaderSignature)
	}
	sec, err := parseTimestamp(ts)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadSignature, HeaderTimestamp, err)
	}
	if n, err := hex.DecodeString(nonce); err != nil || len(n) != nonceBytes {
		return fmt.Errorf("%w: %s must be %d bytes in hex", ErrBadSignature, HeaderNonce, nonceBytes)
	}
	got, err := parseSignature(sig)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadSignature, HeaderSignature, err)
	}

	now := v.now()
	skew := v.maxSkew()
	if d := now.Sub(time.Unix(sec, 0)); d > skew || d < -skew {
		return fmt.Errorf("%w: timestamp %s is %s from now, more than %s", ErrStale, ts, d.Truncate(time.Second), skew)
	}

	ok, haveSecret := false, false
	for _, s := range v.Secrets {
		if len(s) == 0 {
			continue // an empty key would make signatures anyone can compute
		}
		haveSecret = true
		// Every secret is tried, so the time taken does not depend on which one matched.
		if hmac.Equal(got, mac(s, r.Method, r.URL.EscapedPath(), ts, nonce, body)) {
			ok = true
		}
	}
	if !haveSecret {
		return ErrNoSecret
	}
	if !ok {
		return ErrBadSignature
	}
	// Only validly signed requests reach the cache, so nobody without a secret can fill it.
	return v.remember(nonce, sec, now.Unix()-int64(skew/time.Second))
}

// Middleware verifies every request before next sees it: it reads the whole body (at most
// MaxBodyBytes, else 413), answers 401 {"error": …} to a request that fails Verify, and gives
// next the request with its body restored.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := v.MaxBodyBytes
		if limit <= 0 {
			limit = DefaultMaxBodyBytes
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", limit))
				return
			}
			WriteError(w, http.StatusBadRequest, "reading body: "+err.Error())
			return
		}
		if err := v.Verify(r, body); err != nil {
			if v.Logger != nil {
				v.Logger.Warn("agent request refused", "method", r.Method, "path", r.URL.EscapedPath(),
					"remote", r.RemoteAddr, "error", err.Error())
			}
			WriteError(w, http.StatusUnauthorized, "unauthorized: "+err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// remember records nonce with its timestamp, refusing one already seen. Entries whose
// timestamp is older than oldest can no longer pass the skew check and are dropped.
func (v *Verifier) remember(nonce string, ts, oldest int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = make(map[string]int64)
	}
	for len(v.order) > 0 && v.order[0].ts < oldest {
		delete(v.seen, heap.Pop(&v.order).(nonceEntry).nonce)
	}
	if ts <= v.floor {
		return fmt.Errorf("%w: timestamp %d is not after %d (replay cache full)", ErrStale, ts, v.floor)
	}
	if _, dup := v.seen[nonce]; dup {
		return ErrReplayed
	}
	limit := v.MaxNonces
	if limit <= 0 {
		limit = DefaultMaxNonces
	}
	for len(v.seen) >= limit {
		e := heap.Pop(&v.order).(nonceEntry)
		delete(v.seen, e.nonce)
		v.floor = max(v.floor, e.ts)
	}
	if ts <= v.floor {
		// This request is itself among the oldest; refusing it keeps the rule that no
		// forgotten nonce's timestamp is ever accepted.
		return fmt.Errorf("%w: timestamp %d is not after %d (replay cache full)", ErrStale, ts, v.floor)
	}
	v.seen[nonce] = ts
	heap.Push(&v.order, nonceEntry{nonce: nonce, ts: ts})
	return nil
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) maxSkew() time.Duration {
	if v.MaxSkew > 0 {
		return v.MaxSkew
	}
	return DefaultMaxSkew
}

// parseTimestamp accepts only plain decimal digits, the one form Sign writes.
func parseTimestamp(s string) (int64, error) {
	if len(s) > 12 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not unix seconds")
	}
	return strconv.ParseInt(s, 10, 64)
}

func parseSignature(s string) ([]byte, error) {
	hexSig, ok := strings.CutPrefix(s, signaturePrefix)
	if !ok {
		return nil, errors.New("unsupported version, want " + signaturePrefix)
	}
	b, err := hex.DecodeString(hexSig)
	if err != nil || len(b) != 32 {
		return nil, errors.New("want 32 bytes in hex")
	}
	return b, nil
}

type nonceEntry struct {
	nonce string
	ts    int64
}

// nonceHeap is a min-heap of nonces by timestamp, for container/heap.
type nonceHeap []nonceEntry

func (h nonceHeap) Len() int           { return len(h) }
func (h nonceHeap) Less(i, j int) bool { return h[i].ts < h[j].ts }
func (h nonceHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nonceHeap) Push(x any)        { *h = append(*h, x.(nonceEntry)) }
func (h *nonceHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
