package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/demo"
)

// gatewayProbe is one hostile request, written on the wire as is (so that a path keeps its
// dots and a header its CR), and the statuses it may get.
type gatewayProbe struct {
	name   string
	method string
	path   string // after the API's base path; "{node}" is the probe's node
	header string // extra header lines, each ending in \r\n
	body   []string
	pause  time.Duration // between the body's parts
	want   []int
}

// Statuses of API Gateway itself: a path or method that names no resource and method of the
// API is refused before the function runs, with 403 {"message":"Missing Authentication Token"}.
const gatewayNoRoute = http.StatusForbidden

// TestHostileInputThroughTheGateway sends the hostile inputs that only the whole path shows
// (API Gateway's routing and the function's adapter: dot segments, escaped slashes, header
// framing, big and slow bodies) and checks that each gets its documented 4xx, never a redirect
// or a 5xx, and changes nothing on the node (its items, the head of its changes chain
// included; refusals may append to its calls chain, docs/api.md, "Audit"). The rest of the probes
// run in process: shared/httpapi TestHostileInputProbes.
func TestHostileInputThroughTheGateway(t *testing.T) {
	api, err := url.Parse(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSuffix(api.Path, "/")
	dry := `{"unitIds":["gpu-2"],"dryRun":true}`
	res := "/v1/nodes/{node}/reservations/" + demo.ReservationID
	reclaim := res + "/reclaim"
	json := "Content-Type: application/json\r\n"
	probes := []gatewayProbe{
		{name: "reservation id .", method: "GET", path: "/v1/nodes/{node}/reservations/.", want: []int{404}},
		{name: "reservation id ..", method: "GET", path: "/v1/nodes/{node}/reservations/..", want: []int{404}},
		{name: "reservation id %2E%2E", method: "GET", path: "/v1/nodes/{node}/reservations/%2E%2E", want: []int{404}},
		{name: "node id .", method: "GET", path: "/v1/nodes/./reservations/" + demo.ReservationID, want: []int{404}},
		{name: "node id ..", method: "POST", path: "/v1/nodes/../reservations/" + demo.ReservationID + "/reclaim", header: json, body: []string{dry}, want: []int{404}},
		{name: "reclaim id ..", method: "GET", path: res + "/reclaims/..", want: []int{404}},
		{name: "key id ..", method: "GET", path: "/v1/keys/..", want: []int{404}},
		{name: ".. after the route", method: "GET", path: res + "/..", want: []int{gatewayNoRoute}},
		{name: "reclaim then ..", method: "POST", path: reclaim + "/..", header: json, body: []string{dry}, want: []int{gatewayNoRoute}},
		// API Gateway keeps %2F escaped and routes it as part of the id (404 from the API); the
		// emulator decodes it first and finds no resource (403). (It would even route
		// res-1%2Frelease to the release route, which AWS does not: local-aws.md.)
		{name: "escaped slash in an id", method: "GET", path: "/v1/nodes/{node}/reservations/res%2F1", want: []int{404, gatewayNoRoute}},
		{name: "empty segment", method: "GET", path: "/v1/nodes//reservations/" + demo.ReservationID, want: []int{gatewayNoRoute, 404}},
		{name: "unicode id", method: "GET", path: "/v1/nodes/{node}/reservations/r%C3%A9s-1", want: []int{404}},
		{name: "right-to-left override in an id", method: "GET", path: "/v1/nodes/{node}/reservations/res-1%E2%80%AE", want: []int{404}},
		{name: "2 KB id", method: "GET", path: "/v1/nodes/{node}/reservations/" + strings.Repeat("r", 2048), want: []int{404}},
		{name: "129-character node id", method: "POST", path: "/v1/nodes/" + strings.Repeat("n", 129) + "/reservations/" + demo.ReservationID + "/reclaim", header: json, body: []string{dry}, want: []int{404}},
		{name: "CR in a header", method: "POST", path: reclaim, header: json + "X-Note: a\rb\r\n", body: []string{dry}, want: []int{400}},
		// A bare LF ends a header line (RFC 9112 lets a server take it so): here it smuggles a
		// second Authorization in, and two are refused.
		{name: "LF in a header", method: "POST", path: reclaim, header: json + "X-Note: a\nAuthorization: Bearer " + keyAudience + "\r\n", body: []string{dry}, want: []int{400, 401}},
		{name: "CR LF in the Idempotency-Key (folded)", method: "POST", path: reclaim, header: json + "Idempotency-Key: k1\r\n x\r\n", body: []string{`{"unitIds":["gpu-2"]}`}, want: []int{400, 422}},
		{name: "20 KB Authorization", method: "POST", path: reclaim, header: json + "Authorization: Bearer " + strings.Repeat("a", 20<<10) + "\r\n", body: []string{dry}, want: []int{401, 431}},
		{name: "2 MiB of headers", method: "POST", path: reclaim, header: json + "X-Junk: " + strings.Repeat("a", 2<<20) + "\r\n", body: []string{dry}, want: []int{431}},
		{name: "1 MiB body", method: "POST", path: reclaim, header: json, body: []string{`{"unitIds":["gpu-2"],"reason":"` + strings.Repeat("a", 1<<20) + `"}`}, want: []int{413}},
		{name: "body nested 10,001 deep", method: "POST", path: reclaim, header: json, body: []string{strings.Repeat("[", 10001) + strings.Repeat("]", 10001)}, want: []int{400}},
		{name: "10,000 unit ids", method: "POST", path: reclaim, header: json, body: []string{`{"unitIds":["g"` + strings.Repeat(`,"g"`, 9999) + `]}`}, want: []int{422}},
		{name: "slow body", method: "POST", path: reclaim, header: json, body: []string{`{"unitIds":`, `["gpu-2"],`, `"dryRun":true}`}, pause: 300 * time.Millisecond, want: []int{200}},
		{name: "slow body, one that changes nothing", method: "POST", path: reclaim, header: json, body: []string{`{"unitIds":`, `["gpu-2"],"dryRun":`, `"yes"}`}, pause: 300 * time.Millisecond, want: []int{400}},
		{name: "Content-Type application/vnd.api+json", method: "POST", path: reclaim, header: "Content-Type: application/vnd.api+json\r\n", body: []string{dry}, want: []int{200}},
		{name: "Content-Type text/plain", method: "POST", path: reclaim, header: "Content-Type: text/plain\r\n", body: []string{dry}, want: []int{415}},
		{name: "two Authorization headers", method: "POST", path: reclaim, header: json + "Authorization: Bearer " + keyAudience + "\r\n", body: []string{`{"unitIds":["gpu-2"]}`}, want: []int{401}},
		{name: "method TRACE", method: "TRACE", path: res, want: []int{gatewayNoRoute, 405}},
	}
	node := newNode(t, nil)
	before := partition(t, node)
	counts := map[int]int{}
	for _, p := range probes {
		t.Run(p.name, func(t *testing.T) {
			status, hdr, body := sendRaw(t, api.Host, p, base+strings.ReplaceAll(p.path, "{node}", node))
			counts[status]++
			switch {
			case status >= 300 && status < 400:
				t.Fatalf("redirect %d to %q", status, hdr.Get("Location"))
			case status >= 500:
				t.Fatalf("%d: %s", status, body)
			case !slices.Contains(p.want, status):
				t.Fatalf("%d, want one of %v: %.300s", status, p.want, body)
			}
		})
	}
	if after := partition(t, node); !reflect.DeepEqual(withoutCallsHead(before), withoutCallsHead(after)) {
		t.Errorf("node %s changed under the probes", node)
	}
	t.Logf("%d probes through the gateway, answers by status: %v", len(probes), counts)
}

// withoutCallsHead drops the head of the node's calls chain, the one item a refusal or a dry
// run moves; the node item keeps the head of its changes chain.
func withoutCallsHead(items []map[string]types.AttributeValue) []map[string]types.AttributeValue {
	return slices.DeleteFunc(slices.Clone(items), func(it map[string]types.AttributeValue) bool {
		sk, ok := it["sk"].(*types.AttributeValueMemberS)
		return ok && sk.Value == "AUDITHEAD#CALLS"
	})
}

// sendRaw writes the probe on a connection of its own, as the owner, and reads the answer.
func sendRaw(t *testing.T, host string, p gatewayProbe, path string) (int, http.Header, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	length := 0
	for _, b := range p.body {
		length += len(b)
	}
	w := bufio.NewWriter(conn)
	fmt.Fprintf(w, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n",
		p.method, path, host, keyOwner, p.header, length)
	for i, b := range p.body {
		if i > 0 && p.pause > 0 {
			_ = w.Flush()
			time.Sleep(p.pause)
		}
		_, _ = w.WriteString(b)
	}
	// The server may answer (and close) before the whole request is written: read its answer.
	_ = w.Flush()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %.200s: no answer: %v", p.method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body
}
