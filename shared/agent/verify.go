package agent

import (
	"bufio"
	"bytes"
	"container/heap"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
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

// Reasons Verify refuses a request (and VerifyAnswer an answer). Every refusal wraps exactly
// one of them; the middleware answers 401 to all of them.
var (
	ErrUnsigned     = errors.New("request is not signed")
	ErrBadSignature = errors.New("signature does not match")
	ErrStale        = errors.New("timestamp outside the allowed skew")
	ErrReplayed     = errors.New("nonce already used")
	ErrWrongNode    = errors.New("request is for another node")
	ErrNoSecret     = errors.New("verifier has no key")
)

// Verifier checks request signatures on the agent of node NodeID and signs its answers. It
// accepts a request for NodeID signed with any of Keys (that node's keys, from NodeKey: list
// the new one and the old one during a rotation), at most MaxSkew from now, whose nonce it has
// not seen within the skew window. A request for another node is refused whatever its
// signature, so a request captured on its way to one node cannot be replayed to another, even
// if keys were shared by mistake.
//
// Nonces are remembered in memory, per Verifier: agents behind one endpoint that do not share
// a Verifier do not share replay protection. The cache holds at most MaxNonces entries; when a
// flood of validly signed requests fills it, the oldest nonce is forgotten and every timestamp
// up to and including its timestamp is refused from then on, so a forgotten nonce can never be
// replayed (the window shrinks instead of opening).
//
// Set the fields before first use (then change Keys only with SetKeys); the zero values of the
// others mean their defaults.
type Verifier struct {
	NodeID       string
	Keys         [][]byte
	MaxSkew      time.Duration
	MaxNonces    int
	MaxBodyBytes int64
	Now          func() time.Time
	// Logger, if set, gets one line per refused request, with the reason.
	Logger *slog.Logger
	// KeyOverlap is how long RotateKey keeps accepting the key it replaced (0:
	// DefaultKeyOverlap).
	KeyOverlap time.Duration

	mu        sync.Mutex // guards Keys once in use, the previous key, and the nonce cache
	prev      []byte     // the key RotateKey replaced, accepted until prevUntil
	prevUntil time.Time
	seen      map[string]int64 // nonce -> timestamp (unix seconds)
	order     nonceHeap        // the same entries, oldest timestamp first
	floor     int64            // timestamps <= floor are refused; 0 until the cache overflows
}

// NewVerifier returns a Verifier for the agent of nodeID with the node's keys and the
// defaults.
func NewVerifier(nodeID string, keys ...[]byte) *Verifier {
	return &Verifier{NodeID: nodeID, Keys: keys}
}

// SetKeys replaces the node's keys (current first) while the verifier is in use, keeping its
// nonce cache: a rotation reaches a running agent without reopening the replay window.
func (v *Verifier) SetKeys(keys ...[]byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.Keys, v.prev = keys, nil
}

// RotateKey makes key the node's only current key, as when its operator installs the key a
// rotation handed out. The key it replaces (the first of Keys) is still accepted for
// KeyOverlap, then refused; a key rotated away before is refused at once.
func (v *Verifier) RotateKey(key []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.prev, v.prevUntil = nil, time.Time{}
	if len(v.Keys) > 0 {
		overlap := v.KeyOverlap
		if overlap <= 0 {
			overlap = DefaultKeyOverlap
		}
		v.prev, v.prevUntil = v.Keys[0], v.now().Add(overlap)
	}
	v.Keys = [][]byte{key}
}

// keys are the keys a request may be signed with now.
func (v *Verifier) keys() [][]byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.prev != nil && v.now().Before(v.prevUntil) {
		return append(slices.Clone(v.Keys), v.prev)
	}
	return v.Keys
}

// Verify checks r's signature headers against body, the request's whole body, and records the
// nonce when they are valid. It does not read r.Body.
func (v *Verifier) Verify(r *http.Request, body []byte) error {
	_, err := v.verify(r, body)
	return err
}

// verify is Verify, returning the key that signed the request, to sign the answer with: the
// signer certainly holds it, even mid-rotation.
func (v *Verifier) verify(r *http.Request, body []byte) ([]byte, error) {
	node := r.Header.Get(HeaderNode)
	ts, nonce, sig := r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderNonce), r.Header.Get(HeaderSignature)
	if node == "" || ts == "" || nonce == "" || sig == "" {
		return nil, fmt.Errorf("%w: missing %s, %s, %s or %s", ErrUnsigned, HeaderNode, HeaderTimestamp, HeaderNonce, HeaderSignature)
	}
	if node != v.NodeID {
		return nil, fmt.Errorf("%w: %s is %q, this is node %q", ErrWrongNode, HeaderNode, node, v.NodeID)
	}
	sec, err := parseTimestamp(ts)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSignature, HeaderTimestamp, err)
	}
	if n, err := hex.DecodeString(nonce); err != nil || len(n) != nonceBytes {
		return nil, fmt.Errorf("%w: %s must be %d bytes in hex", ErrBadSignature, HeaderNonce, nonceBytes)
	}
	got, err := parseSignature(sig)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSignature, HeaderSignature, err)
	}

	now := v.now()
	skew := v.maxSkew()
	if d := now.Sub(time.Unix(sec, 0)); d > skew || d < -skew {
		return nil, fmt.Errorf("%w: timestamp %s is %s from now, more than %s", ErrStale, ts, d.Truncate(time.Second), skew)
	}
	keys := v.keys()
	if !slices.ContainsFunc(keys, func(k []byte) bool { return len(k) > 0 }) {
		return nil, ErrNoSecret
	}
	// The MAC names v.NodeID, not the header: a signature made for another node never matches.
	i := matchKey(keys, got, func(k []byte) []byte {
		return requestMAC(k, v.NodeID, r.Method, r.URL.EscapedPath(), ts, nonce, body)
	})
	if i < 0 {
		return nil, ErrBadSignature
	}
	// Only validly signed requests reach the cache, so nobody without a key can fill it.
	if err := v.remember(nonce, sec, now.Unix()-int64(skew/time.Second)); err != nil {
		return nil, err
	}
	return keys[i], nil
}

// Middleware verifies every request before next sees it: it reads the whole body (at most
// MaxBodyBytes, else 413), answers 401 {"error": …} to a request that fails Verify, and gives
// next the request with its body restored. It signs next's answer (status and body, with the
// key that signed the request and its nonce), so the service can tell it from a forgery; next's
// answer is therefore buffered and sent when next returns. A 401 is signed with the agent's
// current key (the first of Keys), so that it proves which key the agent holds; other refusals
// are not signed.
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
		key, err := v.verify(r, body)
		if err != nil {
			if v.Logger != nil {
				v.Logger.Warn("agent request refused", "node", v.NodeID, "method", r.Method, "path", r.URL.EscapedPath(),
					"remote", r.RemoteAddr, "error", err.Error())
			}
			aw := &answerWriter{w: w, header: http.Header{}}
			WriteError(aw, http.StatusUnauthorized, "unauthorized: "+err.Error())
			// Signed with the key this agent holds, when it holds one: the proof the service
			// asks for before it signs with the key it rotated away (see Client), which an
			// unsigned or forged 401 cannot give.
			if held := v.current(); held != nil {
				SignAnswer(aw.header, v.NodeID, held, aw.status, r.Header.Get(HeaderNonce), aw.body.Bytes(), v.now())
			}
			aw.send()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		aw := &answerWriter{w: w, header: http.Header{}}
		next.ServeHTTP(aw, r)
		if aw.hijacked {
			return
		}
		if aw.status == 0 {
			aw.status = http.StatusOK
		}
		SignAnswer(aw.header, v.NodeID, key, aw.status, r.Header.Get(HeaderNonce), aw.body.Bytes(), v.now())
		aw.send()
	})
}

// current is the agent's current key (the first non-empty of Keys), or nil.
func (v *Verifier) current() []byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, k := range v.Keys {
		if len(k) > 0 {
			return k
		}
	}
	return nil
}

// answerWriter holds an answer until it is complete, so that it can be signed. It supports
// Hijack (a handler may take the connection over) but not Flush: a flushed answer could not be
// signed.
type answerWriter struct {
	w        http.ResponseWriter
	header   http.Header
	status   int
	body     bytes.Buffer
	hijacked bool
}

func (a *answerWriter) Header() http.Header { return a.header }

// send writes the held answer.
func (a *answerWriter) send() {
	maps.Copy(a.w.Header(), a.header)
	a.w.WriteHeader(a.status)
	_, _ = a.w.Write(a.body.Bytes()) // the status is sent; a failed write means the caller left
}

func (a *answerWriter) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answerWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if a.body.Len()+len(b) > maxResponseBytes {
		return 0, fmt.Errorf("agent answer over %d bytes", maxResponseBytes)
	}
	return a.body.Write(b)
}

func (a *answerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(a.w).Hijack()
	if err == nil {
		a.hijacked = true
	}
	return conn, rw, err
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
