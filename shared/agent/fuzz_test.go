package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The agent's fuzz targets: what a node's agent (or anything on its path) answers the service,
// and what the service (or anyone) sends an agent. Whatever comes, nothing panics; the service
// takes an answer as done (terminated, unknown, noticed) only when the node's key signed it and
// it says so of the VM asked about; an agent acts only on a request signed with its key.

var fuzzKey = []byte("0123456789abcdef0123456789abcdef")

// answerSeeds are the contract's answers and the usual breaks of it.
var answerSeeds = []struct {
	status int
	body   string
}{
	{200, `{"vmId":"vm-1","state":"terminated"}`},
	{200, `{"vmId":"vm-1","state":"terminated","alreadyGone":true}`},
	{200, `{"vmId":"vm-1","state":"running"}`},
	{200, `{"vmId":"vm-1","reclaimId":"rcl-1","terminateAfter":"2031-01-01T00:00:00Z","state":"noticed"}`},
	{200, `{"vmId":"vm-2","state":"terminated"}`},
	{404, `{"vmId":"vm-1","state":"unknown"}`},
	{404, `not found`},
	{401, `{"error":"bad signature"}`},
	{500, `{"error":"boom"}`},
	{429, ``},
	{200, `{"vmId":"vm-1","state":"terminated"`},
	{200, `null`},
}

// FuzzAgentAnswer: an agent answering terminate, status or notice with any status and body,
// signed (with the node's key) or not.
func FuzzAgentAnswer(f *testing.F) {
	for op := range 3 {
		for _, s := range answerSeeds {
			f.Add(uint8(op), uint16(s.status), []byte(s.body), true)
			f.Add(uint8(op), uint16(s.status), []byte(s.body), false)
		}
	}
	var answer struct {
		status int
		body   []byte
		signed bool
	}
	now := time.Unix(1_900_000_000, 0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answer.signed {
			SignAnswer(w.Header(), "node-1", fuzzKey, answer.status, r.Header.Get(HeaderNonce), answer.body, now)
		}
		w.WriteHeader(answer.status)
		_, _ = w.Write(answer.body)
	}))
	f.Cleanup(srv.Close)
	c := &Client{Keys: KeySet{Current: fuzzKey}, AllowHTTP: true, Now: func() time.Time { return now }, Timeout: 5 * time.Second}
	f.Fuzz(func(t *testing.T, op uint8, status uint16, body []byte, signed bool) {
		answer.status, answer.body, answer.signed = 200+int(status)%400, body, signed
		var got struct {
			VMID      string `json:"vmId"`
			State     string `json:"state"`
			ReclaimID string `json:"reclaimId"`
		}
		about := json.Unmarshal(body, &got) == nil && got.VMID == "vm-1"
		ctx := context.Background()
		var err error
		var done bool // the call took the answer as the VM's end, state or notice
		switch op % 3 {
		case 0:
			var res Result
			res, err = c.Terminate(ctx, srv.URL, "node-1", "vm-1")
			done = err == nil
			if done && (res.VMID != "vm-1" || !about || !(answer.status == 200 && got.State == StateTerminated ||
				answer.status == 404 && got.State == StateUnknown)) {
				t.Fatalf("terminate took %d %q as %+v", answer.status, body, res)
			}
		case 1:
			var state string
			state, err = c.Status(ctx, srv.URL, "node-1", "vm-1")
			done = err == nil
			if done && (!about || state != got.State) {
				t.Fatalf("status took %d %q as %q", answer.status, body, state)
			}
		case 2:
			var known bool
			known, err = c.Notice(ctx, srv.URL, "node-1", "vm-1", NoticeRequest{ReclaimID: "rcl-1", TerminateAfter: "2031-01-01T00:00:00Z"})
			done = err == nil
			if done && (!about || known != (answer.status == 200 && got.State == StateNoticed && got.ReclaimID == "rcl-1")) {
				t.Fatalf("notice took %d %q as known=%v", answer.status, body, known)
			}
		}
		if done && !signed {
			t.Fatalf("op %d took an unsigned %d %q", op%3, answer.status, body)
		}
		var ae *Error
		if err != nil && !errors.As(err, &ae) {
			t.Fatalf("op %d: error %v (%T) is not an *agent.Error", op%3, err, err)
		}
	})
}

// FuzzAgentRequest: a request to an agent with any method, path, body and signature headers,
// either signed with the node's key and then perhaps altered, or made up. The verifier accepts
// it only as signed, unaltered, and once (a replay of its nonce is refused).
func FuzzAgentRequest(f *testing.F) {
	f.Add("POST", "/v1/vms/vm-1/terminate", []byte(nil), true, uint8(0), "")
	f.Add("POST", "/v1/vms/vm-1/notice", []byte(`{"vmId":"vm-1","reclaimId":"rcl-1","terminateAfter":"2031-01-01T00:00:00Z","reason":"reclaim"}`), true, uint8(0), "")
	f.Add("GET", "/v1/vms/vm-1", []byte(nil), true, uint8(1), "node-2")
	f.Add("POST", "/v1/vms/vm-1/terminate", []byte("x"), true, uint8(2), "1900000000")
	f.Add("POST", "/v1/vms/vm-1/terminate", []byte(nil), false, uint8(3), "v1=00")
	f.Add("POST", "/v1/vms/vm-1/terminate", []byte(nil), true, uint8(4), "x")
	now := time.Unix(1_900_000_000, 0)
	f.Fuzz(func(t *testing.T, method, path string, body []byte, sign bool, alter uint8, value string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		r, err := http.NewRequest(method, "http://agent.example"+path, nil)
		if err != nil {
			return // not a request any client can send
		}
		v := NewVerifier("node-1", fuzzKey)
		v.Now = func() time.Time { return now }
		if sign {
			if err := Sign(r, "node-1", fuzzKey, body, now); err != nil {
				t.Fatal(err)
			}
		}
		altered := false
		if h := []string{"", HeaderNode, HeaderTimestamp, HeaderNonce, HeaderSignature}[alter%5]; h != "" && r.Header.Get(h) != value {
			r.Header.Set(h, value)
			altered = true
		}
		err = v.Verify(r, body)
		if err == nil && (!sign || altered) {
			t.Fatalf("accepted %s %s (signed %v, %v) with headers %v", method, path, sign, altered, r.Header)
		}
		if err == nil && v.Verify(r, body) == nil {
			t.Fatalf("accepted %s %s twice: a replay", method, path)
		}
	})
}
