package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

// agentServer is a test agent under /prefix that verifies signatures and answers with h.
func agentServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	v := NewVerifier(testNode, secret)
	mux.Handle("POST /prefix/v1/vms/{vm}/terminate", v.Middleware(h))
	mux.Handle("GET /prefix/v1/vms/{vm}", v.Middleware(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// drop hijacks the connection, starts an answer and closes the connection mid-body.
func drop(w http.ResponseWriter, _ *http.Request) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n{\"vmId\":")
	buf.Flush()
	conn.Close()
}

func TestClientTerminate(t *testing.T) {
	tests := []struct {
		name          string
		vmID          string
		handler       http.HandlerFunc
		timeout       time.Duration
		want          Result
		wantErr       bool
		wantRetryable bool
		wantStatus    int
		wantIs        error
	}{
		{name: "terminated", vmID: "vm-1", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated})
		}, want: Result{VMID: "vm-1"}},
		{name: "already gone", vmID: "vm-1", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated, AlreadyGone: true})
		}, want: Result{VMID: "vm-1", AlreadyGone: true}},
		{name: "unknown vm is already gone", vmID: "vm-1", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}, want: Result{VMID: "vm-1", AlreadyGone: true}},
		{name: "404 without the contract's body is permanent", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.NotFound(w, nil)
		}, wantErr: true, wantStatus: 404},
		{name: "escaped vm id", vmID: "vm/1 ?#%", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated})
		}, want: Result{VMID: "vm/1 ?#%"}},
		{name: "500 is retryable", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, 500, "hypervisor busy")
		}, wantErr: true, wantRetryable: true, wantStatus: 500},
		{name: "503 without body is retryable", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(503)
		}, wantErr: true, wantRetryable: true, wantStatus: 503},
		{name: "429 is retryable", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, 429, "slow down")
		}, wantErr: true, wantRetryable: true, wantStatus: 429},
		{name: "403 is permanent", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, 403, "not yours")
		}, wantErr: true, wantStatus: 403},
		{name: "400 is permanent", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			WriteError(w, 400, "bad")
		}, wantErr: true, wantStatus: 400},
		{name: "redirect is not followed", vmID: "vm-1", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://elsewhere.test/", http.StatusTemporaryRedirect)
		}, wantErr: true, wantStatus: 307},
		{name: "connection dropped mid-answer is retryable", vmID: "vm-1", handler: drop,
			wantErr: true, wantRetryable: true, wantStatus: 200},
		{name: "timeout is retryable", vmID: "vm-1", timeout: 50 * time.Millisecond, handler: func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, wantErr: true, wantRetryable: true, wantIs: context.DeadlineExceeded},
		{name: "answer about another vm is permanent", vmID: "vm-1", handler: func(w http.ResponseWriter, _ *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: "vm-2", State: StateTerminated})
		}, wantErr: true, wantStatus: 200},
		{name: "200 that is not terminated is permanent", vmID: "vm-1", handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateRunning})
		}, wantErr: true, wantStatus: 200},
		{name: "invalid vm id is permanent", vmID: "..", handler: func(w http.ResponseWriter, _ *http.Request) {
			t.Error("request sent for an invalid vm id")
		}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := agentServer(t, tc.handler)
			c := &Client{Keys: testKeys, AllowHTTP: true, Timeout: tc.timeout}
			got, err := c.Terminate(context.Background(), srv.URL+"/prefix", testNode, tc.vmID)
			if !tc.wantErr {
				if err != nil || got != tc.want {
					t.Fatalf("Terminate = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("Terminate error = %v (%T), want *Error", err, err)
			}
			if ae.Retryable() != tc.wantRetryable || IsRetryable(err) != tc.wantRetryable {
				t.Errorf("Retryable = %v, want %v (%v)", ae.Retryable(), tc.wantRetryable, err)
			}
			if ae.StatusCode != tc.wantStatus {
				t.Errorf("StatusCode = %d, want %d (%v)", ae.StatusCode, tc.wantStatus, err)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v is not %v", err, tc.wantIs)
			}
			msg := err.Error()
			if !strings.Contains(msg, `"`+tc.vmID+`"`) || (tc.wantStatus != 0 && !strings.Contains(msg, "HTTP "+strconv.Itoa(tc.wantStatus))) {
				t.Errorf("message %q does not name the vm and the status", msg)
			}
		})
	}
}

func TestClientPathPrefixAndEscaping(t *testing.T) {
	var gotPath, gotVM string
	mux := http.NewServeMux()
	mux.Handle("POST /nodes/{node}/v1/vms/{vm}/terminate", NewVerifier(testNode, secret).Middleware(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotPath, gotVM = r.URL.EscapedPath(), r.PathValue("vm")
			if r.PathValue("node") != "node a" {
				t.Errorf("node = %q", r.PathValue("node"))
			}
			WriteJSON(w, 200, TerminateResponse{VMID: gotVM, State: StateTerminated})
		})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	tests := []struct{ base, vm, wantPath string }{
		{srv.URL + "/nodes/node%20a", "vm/1", "/nodes/node%20a/v1/vms/vm%2F1/terminate"},
		{srv.URL + "/nodes/node%20a/", "vm-2", "/nodes/node%20a/v1/vms/vm-2/terminate"},
		{srv.URL + "/nodes/node%20a", "a b", "/nodes/node%20a/v1/vms/a%20b/terminate"},
	}
	c := &Client{Keys: testKeys, AllowHTTP: true}
	for _, tc := range tests {
		if _, err := c.Terminate(context.Background(), tc.base, testNode, tc.vm); err != nil {
			t.Fatalf("Terminate(%q, %q): %v", tc.base, tc.vm, err)
		}
		if gotPath != tc.wantPath || gotVM != tc.vm {
			t.Errorf("Terminate(%q, %q) reached %q as vm %q; want %q", tc.base, tc.vm, gotPath, gotVM, tc.wantPath)
		}
	}
}

func TestClientMalformedEndpointIsPermanent(t *testing.T) {
	for _, base := range []string{"", "://x", "127.0.0.1:1/node", "ftp://host/x", "http:///path", "http://h/p?q=1", "http://h/p#f"} {
		_, err := (&Client{Keys: testKeys, AllowHTTP: true}).Terminate(context.Background(), base, testNode, "vm-1")
		var ae *Error
		if !errors.As(err, &ae) || ae.Retryable() {
			t.Errorf("Terminate(%q) = %v, want a permanent *Error", base, err)
		}
	}
}

func TestClientNoSecretIsPermanent(t *testing.T) {
	_, err := (&Client{AllowHTTP: true}).Terminate(context.Background(), "http://127.0.0.1:1/x", testNode, "vm-1")
	if err == nil || IsRetryable(err) {
		t.Fatalf("Terminate without a secret = %v, want a permanent error", err)
	}
}

func TestClientConnectionRefusedIsRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = (&Client{Keys: testKeys, AllowHTTP: true}).Terminate(context.Background(), "http://"+addr+"/n", testNode, "vm-1")
	if !IsRetryable(err) {
		t.Fatalf("Terminate to a closed port = %v, want retryable", err)
	}
}

func TestClientStatus(t *testing.T) {
	tests := []struct {
		name          string
		handler       http.HandlerFunc
		want          string
		wantErr       bool
		wantRetryable bool
	}{
		{"running", func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, StatusResponse{VMID: r.PathValue("vm"), State: StateRunning})
		}, StateRunning, false, false},
		{"terminating", func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, StatusResponse{VMID: r.PathValue("vm"), State: StateTerminating})
		}, StateTerminating, false, false},
		{"unknown", func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 404, StatusResponse{VMID: r.PathValue("vm"), State: StateUnknown})
		}, StateUnknown, false, false},
		{"404 from elsewhere", func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }, "", true, false},
		{"500", func(w http.ResponseWriter, _ *http.Request) { WriteError(w, 500, "x") }, "", true, true},
		{"bad state", func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, StatusResponse{VMID: r.PathValue("vm"), State: "paused"})
		}, "", true, false},
		{"not json", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) }, "", true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := agentServer(t, tc.handler)
			got, err := (&Client{Keys: testKeys, AllowHTTP: true}).Status(context.Background(), srv.URL+"/prefix", testNode, "vm-1")
			if (err != nil) != tc.wantErr || got != tc.want || IsRetryable(err) != tc.wantRetryable {
				t.Fatalf("Status = %q, %v (retryable %v); want %q, err %v, retryable %v",
					got, err, IsRetryable(err), tc.want, tc.wantErr, tc.wantRetryable)
			}
		})
	}
}

func TestClientReusesConnections(t *testing.T) {
	var conns atomic.Int32
	mux := http.NewServeMux()
	mux.Handle("POST /n/v1/vms/{vm}/terminate", NewVerifier(testNode, secret).Middleware(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, 200, TerminateResponse{VMID: r.PathValue("vm"), State: StateTerminated})
		})))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	c := &Client{Keys: testKeys, AllowHTTP: true, HTTP: &http.Client{Transport: &http.Transport{}}}
	for _, vm := range []string{"vm-1", "vm-2", "vm-3", "vm-4", "vm-5"} {
		if _, err := c.Terminate(context.Background(), srv.URL+"/n", testNode, vm); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 sequential calls opened %d connections, want 1", n)
	}
}

// TestClientRefusesWhatRegistrationRefuses holds the client and registration to one check:
// an endpoint registration accepts is one the client calls, and one the client refuses for
// good is refused at registration, so no node is registered into permanent failure.
func TestClientRefusesWhatRegistrationRefuses(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusNotFound, TerminateResponse{VMID: "vm-1", State: StateUnknown})
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		base      string
		allowHTTP bool
		callable  bool
	}{
		{srv.URL + "/agent", true, true},
		{srv.URL + "/agent", false, false},
		{srv.URL + "/agent?x=1", true, false},
		{srv.URL + "/agent?", true, false},
		{srv.URL + "/agent#f", true, false},
		{srv.URL + "/agent#", true, false},
		{strings.Replace(srv.URL, "http://", "http://u:p@", 1), true, false},
		{"ftp://h/agent", true, false},
		{"/agent", true, false},
		{"", true, false},
	}
	for _, tt := range tests {
		_, regErr := capacity.ParseAgentEndpoint(tt.base, tt.allowHTTP)
		_, err := (&Client{Keys: testKeys, AllowHTTP: tt.allowHTTP}).Terminate(context.Background(), tt.base, testNode, "vm-1")
		var ae *Error
		refused := errors.As(err, &ae) && !ae.Retryable() && ae.StatusCode == 0
		if (regErr == nil) != tt.callable || refused == tt.callable {
			t.Errorf("%q (allowHTTP %v): registration err %v, client err %v; want callable %v by both", tt.base, tt.allowHTTP, regErr, err, tt.callable)
		}
	}
}
