package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// noticeServer is node-a's agent under /prefix with the notice route (h), behind its verifier.
func noticeServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("POST /prefix/v1/vms/{vm}/notice", NewVerifier(testNode, secret).Middleware(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// noticed answers the notice as the contract says, echoing the request.
func noticed(already bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req NoticeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.VMID != r.PathValue("vm") {
			WriteError(w, 400, "bad notice")
			return
		}
		WriteJSON(w, 200, NoticeResponse{VMID: req.VMID, ReclaimID: req.ReclaimID, TerminateAfter: req.TerminateAfter, State: StateNoticed, AlreadyNoticed: already})
	}
}

var testNotice = NoticeRequest{ReclaimID: "rcl_1", TerminateAfter: "2026-12-03T20:00:04Z", Reason: NoticeReasonReclaim}

func TestClientNotice(t *testing.T) {
	tests := []struct {
		name          string
		handler       http.HandlerFunc
		timeout       time.Duration
		wantKnown     bool
		wantErr       error // matched with errors.Is; nil: no error
		wantFailure   bool  // some other *Error
		wantRetryable bool
	}{
		{name: "delivered", handler: noticed(false), wantKnown: true},
		{name: "delivered before (idempotent)", handler: noticed(true), wantKnown: true},
		{name: "unknown vm", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}},
		{name: "agent without the route: plain 404", handler: http.NotFound, wantErr: ErrNoticeUnsupported},
		{name: "agent without the route: 405", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, 405, "method not allowed")
		}, wantErr: ErrNoticeUnsupported},
		{name: "agent without notices: 501", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, 501, "not implemented")
		}, wantErr: ErrNoticeUnsupported},
		{name: "agent down: 503", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, 503, "busy")
		}, wantFailure: true, wantRetryable: true},
		{name: "answer for another reclaim", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, NoticeResponse{VMID: r.PathValue("vm"), ReclaimID: "rcl_other", State: StateNoticed})
		}, wantFailure: true},
		{name: "slow agent: cut off by the timeout", timeout: 50 * time.Millisecond, handler: func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(300 * time.Millisecond)
			noticed(false)(w, r)
		}, wantFailure: true, wantRetryable: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := noticeServer(t, tc.handler)
			c := &Client{Keys: testKeys, AllowHTTP: true, Timeout: tc.timeout}
			known, err := c.Notice(context.Background(), srv.URL+"/prefix", testNode, "vm-1", testNotice)
			var ae *Error
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) || IsRetryable(err) {
					t.Fatalf("Notice = %v, want %v, not retryable", err, tc.wantErr)
				}
			case tc.wantFailure:
				if !errors.As(err, &ae) || errors.Is(err, ErrNoticeUnsupported) || ae.Retryable() != tc.wantRetryable || ae.Op != "notice" {
					t.Fatalf("Notice = %v, want a notice failure, retryable %v", err, tc.wantRetryable)
				}
			case err != nil:
				t.Fatalf("Notice = %v", err)
			}
			if known != tc.wantKnown {
				t.Errorf("known = %v, want %v", known, tc.wantKnown)
			}
		})
	}
}

// TestNoticeSignatureCoversTheBody: the notice's body is signed; a request whose body was
// changed on the way (a later terminateAfter, another reclaim) is refused, and so is the same
// request sent twice.
func TestNoticeSignatureCoversTheBody(t *testing.T) {
	body, err := json.Marshal(NoticeRequest{VMID: "vm-1", ReclaimID: "rcl_1", TerminateAfter: "2026-12-03T20:00:04Z", Reason: NoticeReasonReclaim})
	if err != nil {
		t.Fatal(err)
	}
	url := "https://agent.test" + NoticePath("vm-1")
	tests := []struct {
		name string
		body []byte // sent instead of the signed body; nil: as signed
		want error
	}{
		{name: "as signed"},
		{name: "terminateAfter changed", body: []byte(`{"vmId":"vm-1","reclaimId":"rcl_1","terminateAfter":"2027-01-01T00:00:00Z","reason":"reclaim"}`), want: ErrBadSignature},
		{name: "no body", body: []byte{}, want: ErrBadSignature},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := &Verifier{NodeID: testNode, Keys: [][]byte{secret}, Now: fixedNow(t0)}
			r := signed(t, secret, http.MethodPost, url, body, t0)
			sent := body
			if tc.body != nil {
				sent = tc.body
			}
			if err := v.Verify(r, sent); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				if err := v.Verify(r, sent); !errors.Is(err, ErrReplayed) {
					t.Fatalf("replayed notice: Verify = %v, want %v", err, ErrReplayed)
				}
			}
		})
	}
}

// TestClientNoticeSendsTheSignedRequest: what reaches the agent is the contract's request: the
// notice path, the JSON body naming the VM, reclaim, time and reason, signed for the node.
func TestClientNoticeSendsTheSignedRequest(t *testing.T) {
	var got NoticeRequest
	var path string
	srv := noticeServer(t, func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.EscapedPath()
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("body %q: %v", b, err)
		}
		WriteJSON(w, 200, NoticeResponse{VMID: got.VMID, ReclaimID: got.ReclaimID, State: StateNoticed})
	})
	c := &Client{Keys: testKeys, AllowHTTP: true}
	if _, err := c.Notice(context.Background(), srv.URL+"/prefix", testNode, "vm/1", testNotice); err != nil {
		t.Fatal(err)
	}
	want := testNotice
	want.VMID = "vm/1"
	if got != want || path != "/prefix/v1/vms/vm%2F1/notice" {
		t.Fatalf("agent got %+v at %s, want %+v at /prefix/v1/vms/vm%%2F1/notice", got, path, want)
	}
}

// TestNodeAgentNoticeErrors: the domain sees the contract's answers as its own errors.
func TestNodeAgentNoticeErrors(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    error
	}{
		{"delivered", noticed(false), nil},
		{"unknown vm", func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}, capacity.ErrNoticeUnknownVM},
		{"unsupported", http.NotFound, capacity.ErrNoticeUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := noticeServer(t, tc.handler)
			a := NodeAgent{Client: &Client{AllowHTTP: true}, Legacy: testKeys}
			err := a.Notice(context.Background(), capacity.Node{ID: testNode, AgentEndpoint: srv.URL + "/prefix"},
				capacity.EvictionNotice{VMID: "vm-1", ReclaimID: "rcl_1", TerminateAfter: t0, Reason: capacity.NoticeReasonReclaim})
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Notice = %v, want %v", err, tc.want)
			}
		})
	}
}
