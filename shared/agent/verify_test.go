package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

const testNode = "node-a"

var (
	master    = []byte("test-master-secret-current-0123456789")
	oldMaster = []byte("test-master-secret-previous-0123456789")
	secret    = mustNodeKey(master, testNode)    // node-a's current key
	oldSecret = mustNodeKey(oldMaster, testNode) // node-a's previous key
	testKeys  = Derived{StaticMasters{Current: master}}
	t0        = time.Unix(1_760_000_000, 0)
)

func mustNodeKey(master []byte, nodeID string) []byte {
	k, err := NodeKey(master, nodeID)
	if err != nil {
		panic(err)
	}
	return k
}

// signed returns a request as a client would send it, signed with key at time at.
func signed(t *testing.T, key []byte, method, rawURL string, body []byte, at time.Time) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, rawURL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := Sign(r, testNode, key, body, at); err != nil {
		t.Fatal(err)
	}
	return r
}

func fixedNow(at time.Time) func() time.Time { return func() time.Time { return at } }

func TestVerify(t *testing.T) {
	const url = "http://agent.test/node-a/v1/vms/vm%2F1/terminate"
	body := []byte(`{"reason":"reclaim"}`)
	tests := []struct {
		name    string
		key     []byte
		at      time.Time // signing time; the verifier's clock is t0
		secrets [][]byte
		tamper  func(r *http.Request, body *[]byte)
		want    error // nil: accepted
	}{
		{name: "round trip", want: nil},
		{name: "tampered method", tamper: func(r *http.Request, _ *[]byte) { r.Method = http.MethodGet }, want: ErrBadSignature},
		{name: "tampered path", tamper: func(r *http.Request, _ *[]byte) {
			r.URL.Path, r.URL.RawPath = "/node-a/v1/vms/vm-2/terminate", ""
		}, want: ErrBadSignature},
		{name: "path unescaped in transit", tamper: func(r *http.Request, _ *[]byte) {
			// "vm%2F1" and "vm/1" are different paths: the escaped form is what is signed.
			r.URL.RawPath = ""
		}, want: ErrBadSignature},
		{name: "tampered body", tamper: func(_ *http.Request, b *[]byte) { *b = []byte(`{"reason":"other"}`) }, want: ErrBadSignature},
		{name: "body dropped", tamper: func(_ *http.Request, b *[]byte) { *b = nil }, want: ErrBadSignature},
		{name: "tampered timestamp", tamper: func(r *http.Request, _ *[]byte) {
			r.Header.Set(HeaderTimestamp, strconv.FormatInt(t0.Unix()+1, 10))
		}, want: ErrBadSignature},
		{name: "tampered nonce", tamper: func(r *http.Request, _ *[]byte) {
			r.Header.Set(HeaderNonce, strings.Repeat("ab", nonceBytes))
		}, want: ErrBadSignature},
		{name: "tampered signature", tamper: func(r *http.Request, _ *[]byte) {
			r.Header.Set(HeaderSignature, "v2="+strings.Repeat("00", 32))
		}, want: ErrBadSignature},
		{name: "unknown signature version", tamper: func(r *http.Request, _ *[]byte) {
			r.Header.Set(HeaderSignature, strings.Replace(r.Header.Get(HeaderSignature), "v2=", "v1=", 1))
		}, want: ErrBadSignature},
		{name: "short nonce", tamper: func(r *http.Request, _ *[]byte) { r.Header.Set(HeaderNonce, "abcd") }, want: ErrBadSignature},
		{name: "timestamp not plain digits", tamper: func(r *http.Request, _ *[]byte) {
			r.Header.Set(HeaderTimestamp, "+"+r.Header.Get(HeaderTimestamp))
		}, want: ErrBadSignature},
		{name: "missing timestamp", tamper: func(r *http.Request, _ *[]byte) { r.Header.Del(HeaderTimestamp) }, want: ErrUnsigned},
		{name: "missing nonce", tamper: func(r *http.Request, _ *[]byte) { r.Header.Del(HeaderNonce) }, want: ErrUnsigned},
		{name: "missing signature", tamper: func(r *http.Request, _ *[]byte) { r.Header.Del(HeaderSignature) }, want: ErrUnsigned},
		{name: "missing node", tamper: func(r *http.Request, _ *[]byte) { r.Header.Del(HeaderNode) }, want: ErrUnsigned},
		{name: "node header names another node", tamper: func(r *http.Request, _ *[]byte) { r.Header.Set(HeaderNode, "node-b") }, want: ErrWrongNode},
		{name: "wrong secret", key: []byte("someone-else"), want: ErrBadSignature},
		{name: "stale", at: t0.Add(-DefaultMaxSkew - time.Second), want: ErrStale},
		{name: "future", at: t0.Add(DefaultMaxSkew + time.Second), want: ErrStale},
		{name: "oldest allowed", at: t0.Add(-DefaultMaxSkew), want: nil},
		{name: "newest allowed", at: t0.Add(DefaultMaxSkew), want: nil},
		{name: "rotation: old secret listed", key: oldSecret, secrets: [][]byte{secret, oldSecret}, want: nil},
		{name: "rotation: new secret listed", key: secret, secrets: [][]byte{secret, oldSecret}, want: nil},
		{name: "rotation: old secret dropped", key: oldSecret, secrets: [][]byte{secret}, want: ErrBadSignature},
		{name: "empty secrets never verify", key: secret, secrets: [][]byte{{}}, want: ErrNoSecret},
		{name: "no secrets", key: secret, secrets: [][]byte{}, want: ErrNoSecret},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key, at, secrets := tc.key, tc.at, tc.secrets
			if key == nil {
				key = secret
			}
			if at.IsZero() {
				at = t0
			}
			if secrets == nil {
				secrets = [][]byte{secret}
			}
			r := signed(t, key, http.MethodPost, url, body, at)
			b := body
			if tc.tamper != nil {
				tc.tamper(r, &b)
			}
			v := &Verifier{NodeID: testNode, Keys: secrets, Now: fixedNow(t0)}
			err := v.Verify(r, b)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifyRefusesReplay(t *testing.T) {
	tests := []struct {
		name      string
		replayAt  time.Duration // after the first call
		wantAgain error
	}{
		{"at once", 0, ErrReplayed},
		{"within the window", DefaultMaxSkew - time.Second, ErrReplayed},
		// Past the window the timestamp check refuses it; the nonce may be forgotten.
		{"after the window", DefaultMaxSkew + time.Second, ErrStale},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			v := &Verifier{NodeID: testNode, Keys: [][]byte{secret}, Now: func() time.Time { return now }}
			r := signed(t, secret, http.MethodPost, "http://agent.test/v1/vms/vm-1/terminate", nil, t0)
			if err := v.Verify(r, nil); err != nil {
				t.Fatalf("first Verify: %v", err)
			}
			now = t0.Add(tc.replayAt)
			if err := v.Verify(r, nil); !errors.Is(err, tc.wantAgain) {
				t.Fatalf("replayed Verify = %v, want %v", err, tc.wantAgain)
			}
		})
	}
}

func TestVerifyForgetsExpiredNonces(t *testing.T) {
	now := t0
	v := &Verifier{NodeID: testNode, Keys: [][]byte{secret}, Now: func() time.Time { return now }}
	for i := range 10 {
		r := signed(t, secret, http.MethodGet, "http://agent.test/v1/vms/vm-"+strconv.Itoa(i), nil, now)
		if err := v.Verify(r, nil); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(DefaultMaxSkew + 2*time.Second)
	r := signed(t, secret, http.MethodGet, "http://agent.test/v1/vms/vm-x", nil, now)
	if err := v.Verify(r, nil); err != nil {
		t.Fatal(err)
	}
	if got := len(v.seen); got != 1 {
		t.Fatalf("nonces remembered = %d, want 1 (the expired ones evicted)", got)
	}
}

func TestVerifyFullCacheNeverForgetsALiveNonce(t *testing.T) {
	v := &Verifier{NodeID: testNode, Keys: [][]byte{secret}, Now: fixedNow(t0), MaxNonces: 2}
	first := signed(t, secret, http.MethodPost, "http://agent.test/v1/vms/a/terminate", nil, t0.Add(-2*time.Second))
	for i, at := range []time.Duration{-2 * time.Second, -time.Second, 0} {
		var r *http.Request
		if i == 0 {
			r = first
		} else {
			r = signed(t, secret, http.MethodPost, "http://agent.test/v1/vms/a/terminate", nil, t0.Add(at))
		}
		if err := v.Verify(r, nil); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if len(v.seen) > 2 {
		t.Fatalf("cache holds %d nonces, bound is 2", len(v.seen))
	}
	// The first nonce was evicted to make room; replaying it must still fail.
	if err := v.Verify(first, nil); !errors.Is(err, ErrStale) {
		t.Fatalf("replay of an evicted nonce = %v, want %v", err, ErrStale)
	}
}

func TestMiddleware(t *testing.T) {
	const url = "http://agent.test/v1/vms/vm-1/terminate"
	tests := []struct {
		name       string
		req        func(t *testing.T) *http.Request
		wantStatus int
		wantCalled bool
	}{
		{"signed", func(t *testing.T) *http.Request {
			return signed(t, secret, http.MethodPost, url, []byte("payload"), time.Now())
		}, http.StatusOK, true},
		{"unsigned", func(t *testing.T) *http.Request {
			return httptest.NewRequest(http.MethodPost, url, strings.NewReader("payload"))
		}, http.StatusUnauthorized, false},
		{"wrongly signed", func(t *testing.T) *http.Request {
			return signed(t, []byte("nope"), http.MethodPost, url, []byte("payload"), time.Now())
		}, http.StatusUnauthorized, false},
		{"body too large", func(t *testing.T) *http.Request {
			big := bytes.Repeat([]byte("x"), DefaultMaxBodyBytes+1)
			return signed(t, secret, http.MethodPost, url, big, time.Now())
		}, http.StatusRequestEntityTooLarge, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			h := NewVerifier(testNode, secret).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				called = true
				b, _ := io.ReadAll(r.Body)
				if string(b) != "payload" {
					t.Errorf("handler got body %q", b)
				}
				w.WriteHeader(http.StatusOK)
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tc.req(t))
			if rec.Code != tc.wantStatus || called != tc.wantCalled {
				t.Fatalf("status %d, handler called %v; want %d, %v (body %s)", rec.Code, called, tc.wantStatus, tc.wantCalled, rec.Body)
			}
			if tc.wantStatus != http.StatusOK {
				var er ErrorResponse
				if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || er.Error == "" {
					t.Fatalf("error body %q is not {\"error\": …}", rec.Body)
				}
			}
		})
	}
}
