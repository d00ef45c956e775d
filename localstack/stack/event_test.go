package stack

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestFixRESTProxyEvent(t *testing.T) {
	type want struct {
		path, contextPath string
	}

	tests := []struct {
		name      string
		event     string
		want      *want // nil: the payload must come back byte-identical
		unchanged bool
	}{
		{
			name: "plain REST event",
			event: `{"resource":"/items/{id}","path":"/items/{id}","httpMethod":"POST","body":"{\"a\":1}",
				"pathParameters":{"id":"abc123"},
				"requestContext":{"resourcePath":"/items/{id}","httpMethod":"POST","path":"/test/items/{id}","apiId":"a1","stage":"test","requestId":"r1"}}`,
			want: &want{path: "/items/abc123", contextPath: "/test/items/abc123"},
		},
		{
			name: "several parameters",
			event: `{"resource":"/v1/nodes/{nodeId}/reservations/{id}/reclaim","path":"/v1/nodes/{nodeId}/reservations/{id}/reclaim",
				"pathParameters":{"nodeId":"n-1","id":"r-2"},"requestContext":{"stage":"local","path":"/local/v1/nodes/{nodeId}/reservations/{id}/reclaim"}}`,
			want: &want{path: "/v1/nodes/n-1/reservations/r-2/reclaim", contextPath: "/local/v1/nodes/n-1/reservations/r-2/reclaim"},
		},
		{
			name: "greedy proxy parameter keeps its slashes",
			event: `{"resource":"/files/{proxy+}","path":"/files/{proxy+}","pathParameters":{"proxy":"a/b c/d"},
				"requestContext":{"stage":"prod","path":"/prod/files/{proxy+}"}}`,
			want: &want{path: "/files/a/b%20c/d", contextPath: "/prod/files/a/b%20c/d"},
		},
		{
			name: "values are escaped as path segments",
			event: `{"resource":"/items/{id}","path":"/items/{id}","pathParameters":{"id":"a b/c?d%e"},
				"requestContext":{"stage":"test","path":"/test/items/{id}"}}`,
			want: &want{path: "/items/a%20b%2Fc%3Fd%25e", contextPath: "/test/items/a%20b%2Fc%3Fd%25e"},
		},
		{
			name: "$default stage is not part of the path",
			event: `{"resource":"/items/{id}","path":"/items/{id}","pathParameters":{"id":"x"},
				"requestContext":{"stage":"$default","path":"/items/{id}"}}`,
			want: &want{path: "/items/x", contextPath: "/items/x"},
		},
		{
			name: "parameter without a value stays a template segment",
			event: `{"resource":"/a/{x}/{y}","path":"/a/{x}/{y}","pathParameters":{"x":"1"},
				"requestContext":{"stage":"s","path":"/s/a/{x}/{y}"}}`,
			want: &want{path: "/a/1/{y}", contextPath: "/s/a/1/{y}"},
		},
		{
			name:  "resource without parameters is already right",
			event: `{"resource":"/items","path":"/items","pathParameters":null,"requestContext":{"stage":"test","path":"/test/items"}}`,
		},
		{
			name: "path that is already real is left alone",
			event: `{"resource":"/items/{id}","path":"/items/abc","pathParameters":{"id":"abc"},
				"requestContext":{"stage":"test","path":"/test/items/abc"}}`,
		},
		{
			name:  "EventBridge event",
			event: `{"version":"0","id":"1","detail-type":"Ping","source":"capacity.test","resources":[],"detail":{"path":"/items/{id}"}}`,
		},
		{
			name:  "Step Functions task input",
			event: `{"resource":"/items/{id}","nodes":["n-1"]}`,
		},
		{
			name:  "invalid JSON",
			event: `{"resource":"/items/{id}","pathParameters":{"id":`,
		},
		{
			name:  "JSON that is not an object",
			event: `["resource","pathParameters","requestContext"]`,
		},
		{
			name:  "pathParameters of the wrong type",
			event: `{"resource":"/items/{id}","path":"/items/{id}","pathParameters":["x"],"requestContext":{"stage":"test"}}`,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.event)
			got := fixRESTProxyEvent(in)

			if tt.want == nil {
				if !bytes.Equal(got, in) {
					t.Fatalf("payload changed:\n got %s\nwant %s", got, in)
				}

				return
			}

			var before, after map[string]any
			if err := json.Unmarshal(in, &before); err != nil {
				t.Fatal(err)
			}

			if err := json.Unmarshal(got, &after); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, got)
			}

			if after["path"] != tt.want.path {
				t.Errorf("path = %v, want %v", after["path"], tt.want.path)
			}

			rc := after["requestContext"].(map[string]any)
			if rc["path"] != tt.want.contextPath {
				t.Errorf("requestContext.path = %v, want %v", rc["path"], tt.want.contextPath)
			}

			// Everything else is as kumo sent it, including the templates.
			delete(before, "path")
			delete(after, "path")
			delete(before["requestContext"].(map[string]any), "path")
			delete(rc, "path")

			b1, _ := json.Marshal(before)
			b2, _ := json.Marshal(after)

			if !bytes.Equal(b1, b2) {
				t.Errorf("other fields changed:\n got %s\nwant %s", b2, b1)
			}
		})
	}
}

func TestFixInvokedFunctionARN(t *testing.T) {
	tests := map[string]string{
		"arn:aws:lambda:local:000000000000:function:fn":     "arn:aws:lambda:us-east-1:000000000000:function:fn",
		"arn:aws:lambda:us-east-1:000000000000:function:fn": "arn:aws:lambda:us-east-1:000000000000:function:fn",
		"": "",
	}

	for in, want := range tests {
		if got := fixInvokedFunctionARN(in); got != want {
			t.Errorf("fixInvokedFunctionARN(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRestoreTrailingSlash(t *testing.T) {
	for _, tc := range []struct {
		name, event, wantPath, wantContext string
	}{
		{"slash restored, header removed",
			`{"resource":"/console","path":"/console","headers":{"X-Local-Trailing-Slash":"1","Accept":"text/html"},"multiValueHeaders":{"X-Local-Trailing-Slash":["1"],"Accept":["text/html"]},"requestContext":{"stage":"local","path":"/local/console"}}`,
			"/console/", "/local/console/"},
		{"no slash: header removed only",
			`{"resource":"/console","path":"/console","headers":{"X-Local-Trailing-Slash":"0"},"requestContext":{"stage":"local","path":"/local/console"}}`,
			"/console", "/local/console"},
		{"host restored as AWS sends it",
			`{"resource":"/v1/nodes","path":"/v1/nodes","headers":{"X-Local-Trailing-Slash":"0","X-Local-Host":"a1.execute-api.localhost:4566"},"multiValueHeaders":{"X-Local-Host":["a1.execute-api.localhost:4566"]},"requestContext":{"stage":"local","path":"/local/v1/nodes"}}`,
			"/v1/nodes", "/local/v1/nodes"},
		{"no slash: an empty greedy match's slash dropped",
			`{"resource":"/console/{proxy+}","path":"/console/","pathParameters":{"proxy":""},"headers":{"X-Local-Trailing-Slash":"0"},"requestContext":{"stage":"local","path":"/local/console/"}}`,
			"/console", "/local/console"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got struct {
				Path              string
				Headers           map[string]string
				MultiValueHeaders map[string][]string
				RequestContext    struct{ Path string }
			}
			if err := json.Unmarshal(restoreTrailingSlash([]byte(tc.event)), &got); err != nil {
				t.Fatal(err)
			}
			if got.Path != tc.wantPath || got.RequestContext.Path != tc.wantContext {
				t.Errorf("path %q, context path %q; want %q, %q", got.Path, got.RequestContext.Path, tc.wantPath, tc.wantContext)
			}
			if _, ok := got.Headers[trailingSlashHeader]; ok {
				t.Errorf("header left in %v", got.Headers)
			}
			if _, ok := got.MultiValueHeaders[trailingSlashHeader]; ok {
				t.Errorf("header left in %v", got.MultiValueHeaders)
			}
			if strings.Contains(tc.event, hostHeader) {
				if _, ok := got.Headers[hostHeader]; ok || got.Headers["Host"] != "a1.execute-api.localhost:4566" ||
					got.MultiValueHeaders["Host"][0] != "a1.execute-api.localhost:4566" {
					t.Errorf("host not restored: %v %v", got.Headers, got.MultiValueHeaders)
				}
			}
		})
	}
	plain := []byte(`{"path":"/v1/nodes/a"}`)
	if got := restoreTrailingSlash(plain); !bytes.Equal(got, plain) {
		t.Errorf("an event without the header changed: %s", got)
	}
}

func TestMarkTrailingSlash(t *testing.T) {
	for _, tc := range []struct {
		host, path string
		want       bool
	}{
		{"a1.execute-api.localhost:4566", "/local/console/", true},
		{"a1.execute-api.localhost:4566", "/local/console", false},
		{"a1.execute-api.localhost:4566", "/local/", false},
		{"localhost:4566", "/local/console/", false},
	} {
		r := httptest.NewRequest("GET", "http://"+tc.host+tc.path, nil)
		r.Header.Set(trailingSlashHeader, "1") // a caller's own is never trusted
		markTrailingSlash(r)
		if got := r.Header.Get(trailingSlashHeader) == "1"; got != tc.want || (strings.Contains(tc.host, "execute-api") && r.Header.Get(trailingSlashHeader) == "") {
			t.Errorf("%s%s: marked %v, want %v", tc.host, tc.path, got, tc.want)
		}
	}
}
