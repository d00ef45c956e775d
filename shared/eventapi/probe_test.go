package eventapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/capacitytest"
)

// TestForgedEnvelopes: events no genuine sender puts (docs/numbers.md, Reliability). Ids and
// free text in a well-formed detail are the domain's to check, as for HTTP (shared/httpapi
// TestHostileInputProbes). None of these reaches the service, so none changes anything; each is either refused with its code, the
// refusal published (final), or, when it is not an event of the bus at all, left to the
// queue and its dead letters; none panics.
func TestForgedEnvelopes(t *testing.T) {
	env := func(mod func(string) string) string { return mod(envelope("ev-1", tenant, valid)) }
	replace := func(old, new string) func(string) string {
		return func(s string) string {
			if !strings.Contains(s, old) {
				panic("probe: no " + old)
			}
			return strings.Replace(s, old, new, 1)
		}
	}
	detail := func(d string) string { return envelope("ev-1", tenant, d) }
	deep := strings.Repeat(`{"a":`, 10001) + `1` + strings.Repeat(`}`, 10001)
	tests := []struct {
		name string
		body string
		arn  string // "" the intake queue
		code capacity.Code
		back bool // left to the queue, nothing published
	}{
		{name: "another account", body: env(replace(`"account":"111111111111"`, `"account":"222222222222"`)), code: capacity.CodeForbidden},
		{name: "another region", body: env(replace(`"region":"us-east-1"`, `"region":"eu-west-1"`)), code: capacity.CodeForbidden},
		{name: "another bus", body: env(replace(`"version":"0",`, `"version":"0","event-bus-name":"default",`)), code: capacity.CodeForbidden},
		{name: "unknown source", body: envelope("ev-1", "evil.automation", valid), code: capacity.CodeForbidden},
		{name: "source in another case", body: envelope("ev-1", strings.ToUpper(tenant), valid), code: capacity.CodeForbidden},
		{name: "source with a trailing space", body: envelope("ev-1", tenant+" ", valid), code: capacity.CodeForbidden},
		{name: "source with a look-alike letter", body: envelope("ev-1", strings.Replace(tenant, "a", "\u0430", 1), valid), code: capacity.CodeForbidden},
		{name: "source with CR LF", body: envelope("ev-1", tenant+"\r\n", valid), code: capacity.CodeForbidden},
		{name: "topology source asking a reclaim", body: envelope("ev-1", capacity.SourceFleet, valid), code: capacity.CodeForbidden},
		{name: "acting for another org", body: detail(strings.Replace(valid, "org-owner", "org-other", 1)), code: capacity.CodeForbidden},
		{name: "acting org of 2 KB", body: detail(strings.Replace(valid, "org-owner", strings.Repeat("o", 2048), 1)), code: capacity.CodeInvalidRequest},
		{name: "acting org ..", body: detail(strings.Replace(valid, "org-owner", "..", 1)), code: capacity.CodeInvalidRequest},
		{name: "detail-type in another case", body: env(replace(`"Capacity Reclaim Requested"`, `"capacity reclaim requested"`)), code: capacity.CodeInvalidRequest},
		{name: "detail-type of an outcome", body: env(replace(`"Capacity Reclaim Requested"`, `"Capacity Reclaim Completed"`)), code: capacity.CodeInvalidRequest},
		{name: "detail as a string", body: detail(fmt.Sprintf("%q", valid)), code: capacity.CodeInvalidRequest},
		{name: "detail as an array", body: detail(`[` + valid + `]`), code: capacity.CodeInvalidRequest},
		// Nested past encoding/json's 10,000 levels, the envelope itself does not decode.
		{name: "detail nested 10,001 deep", body: detail(deep), back: true},
		{name: "detail member nested 10,000 deep", body: detail(strings.TrimSuffix(valid, "}") + `,"reason":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`), back: true},
		{name: "detail member nested 9,990 deep", body: detail(strings.TrimSuffix(valid, "}") + `,"reason":` + strings.Repeat("[", 9990) + strings.Repeat("]", 9990) + `}`), code: capacity.CodeInvalidRequest},
		{name: "10,000 unit ids", body: detail(`{"nodeId":"node-a","reservationId":"res-1","actingOrgId":"org-owner","unitIds":["gpu-2"` + strings.Repeat(`,"gpu-2"`, 9999) + `]}`), code: capacity.CodeInvalidRequest},
		{name: "detail over 64 KiB", body: detail(strings.TrimSuffix(valid, "}") + `,"reason":"` + strings.Repeat("a", 70000) + `"}`), code: capacity.CodeInvalidRequest},
		{name: "detail with a null", body: detail(strings.TrimSuffix(valid, "}") + `,"dryRun":null}`), code: capacity.CodeInvalidRequest},
		{name: "detail member twice", body: detail(strings.TrimSuffix(valid, "}") + `,"actingOrgId":"org-owner"}`), code: capacity.CodeInvalidRequest},
		{name: "detail member in another case", body: detail(strings.TrimSuffix(valid, "}") + `,"DryRun":true}`), code: capacity.CodeInvalidRequest},
		{name: "schedule firing without its id", body: envelope("ev-1", capacity.SourceSchedule, `{"nodeId":"node-a","reservationId":"res-1"}`), code: capacity.CodeInvalidRequest},
		{name: "schedule firing with a request's detail", body: envelope("ev-1", capacity.SourceSchedule, valid), code: capacity.CodeInvalidRequest},
		{name: "no id", body: env(replace(`"id":"ev-1"`, `"id":""`)), back: true},
		{name: "no source", body: envelope("ev-1", "", valid), back: true},
		{name: "account as a number", body: env(replace(`"account":"111111111111"`, `"account":111111111111`)), back: true},
		{name: "not JSON", body: `{"id":"ev-1","source":"` + tenant + `"`, back: true},
		{name: "an SQS message of another queue", body: envelope("ev-1", tenant, valid), arn: intakeQueue + "-other", back: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{res: result(), topo: &capacity.TopologyResult{}}
			pub := &capacitytest.Publisher{}
			b := batch(tt.body)
			if tt.arn != "" {
				b.Records[0].EventSourceARN = tt.arn
			}
			var resp events.SQSEventResponse
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panic: %v", p)
					}
				}()
				var err error
				resp, err = newHandler(svc, pub).Handle(context.Background(), b)
				if err != nil {
					t.Fatal(err)
				}
			}()
			if tt.back {
				checkHandled(t, resp, svc, pub, handled{failed: true})
				return
			}
			d := checkHandled(t, resp, svc, pub, handled{outcome: capacity.DetailReclaimRefused, eventID: "ev-1/refused", code: string(tt.code)})
			if d.RequestEventID != "ev-1" {
				t.Errorf("refusal answers %q, want ev-1", d.RequestEventID)
			}
		})
	}
}
