package client_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/client"
)

// roundTrip counts the requests that would have left the machine.
type roundTrip struct{ sent int }

func (r *roundTrip) RoundTrip(*http.Request) (*http.Response, error) {
	r.sent++
	return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
}

// A key goes only over https, or over http to this machine.
func TestKeyOnlyOverSafeTransport(t *testing.T) {
	tests := []struct {
		endpoint string
		key      string
		wantErr  string // "" = the request is sent
	}{
		{"https://api.example/dev/", "k", ""},
		{"http://127.0.0.1:4566/restapis/a/local/_user_request_/", "k", ""},
		{"http://127.8.9.10/", "k", ""},
		{"http://[::1]:8080/", "k", ""},
		{"http://localhost:4566/", "k", ""},
		{"http://api.example/dev/", "k", "plain http to another machine"},
		{"http://10.0.0.5/", "k", "plain http to another machine"},
		{"http://localhost.attacker.example/", "k", "plain http to another machine"},
		{"http://127.0.0.1.attacker.example/", "k", "plain http to another machine"},
		{"ftp://api.example/", "k", `scheme "ftp"`},
		{"api.example/dev/", "k", "not an absolute URL"},
		// No key, nothing to leak.
		{"http://api.example/dev/", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint+" key "+tt.key, func(t *testing.T) {
			rt := &roundTrip{}
			c := client.New(tt.endpoint, tt.key, &http.Client{Transport: rt})
			_, _, err := c.GetNode(context.Background(), "n1")
			if tt.wantErr == "" {
				if rt.sent != 1 {
					t.Errorf("%d requests sent (error %v), want 1", rt.sent, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one with %q", err, tt.wantErr)
			}
			if rt.sent != 0 {
				t.Errorf("%d requests sent, want none", rt.sent)
			}
		})
	}
}
