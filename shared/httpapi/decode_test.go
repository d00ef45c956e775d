package httpapi_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Strict decoding: a body that is not exactly the documented one never reaches the service.

func TestBadBodyNeverReachesTheService(t *testing.T) {
	big := `{"unitIds":["u1"],"reason":"` + strings.Repeat("a", httpapi.MaxBodyBytes) + `"}`
	tests := []struct {
		name        string
		path        string
		contentType *string
		body        string
		status      int
		code        capacity.Code
	}{
		{"malformed JSON", reclaimPath, nil, `{"unitIds":["u1"]`, 400, httpapi.CodeMalformedRequest},
		{"unquoted key", reclaimPath, nil, `{unitIds:["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"empty body", reclaimPath, nil, ``, 400, httpapi.CodeMalformedRequest},
		{"whitespace body", reclaimPath, nil, " \n\t", 400, httpapi.CodeMalformedRequest},
		{"typo dryrun true", reclaimPath, nil, `{"unitIds":["u1"],"dryrun":true}`, 400, httpapi.CodeMalformedRequest},
		{"typo dryrun false", reclaimPath, nil, `{"unitIds":["u1"],"dryrun":false}`, 400, httpapi.CodeMalformedRequest},
		{"typo DryRun", reclaimPath, nil, `{"unitIds":["u1"],"DryRun":true}`, 400, httpapi.CodeMalformedRequest},
		{"typo dry_run", reclaimPath, nil, `{"unitIds":["u1"],"dry_run":true}`, 400, httpapi.CodeMalformedRequest},
		{"upper-case unitIds", reclaimPath, nil, `{"UNITIDS":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds with a long s", reclaimPath, nil, `{"unitId\u017f":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"unknown field", reclaimPath, nil, `{"unitIds":["u1"],"force":true}`, 400, httpapi.CodeMalformedRequest},
		{"duplicate dryRun", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":true,"dryRun":false}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds as string", reclaimPath, nil, `{"unitIds":"u1"}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds of numbers", reclaimPath, nil, `{"unitIds":[1,2]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds nested", reclaimPath, nil, `{"unitIds":[["u1"]]}`, 400, httpapi.CodeMalformedRequest},
		{"unitIds object", reclaimPath, nil, `{"unitIds":{"u1":true}}`, 400, httpapi.CodeMalformedRequest},
		{"dryRun as string", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":"yes"}`, 400, httpapi.CodeMalformedRequest},
		{"dryRun as number", reclaimPath, nil, `{"unitIds":["u1"],"dryRun":1}`, 400, httpapi.CodeMalformedRequest},
		{"reason as number", reclaimPath, nil, `{"unitIds":["u1"],"reason":42}`, 400, httpapi.CodeMalformedRequest},
		{"array body", reclaimPath, nil, `["u1"]`, 400, httpapi.CodeMalformedRequest},
		{"string body", reclaimPath, nil, `"u1"`, 400, httpapi.CodeMalformedRequest},
		{"null body", reclaimPath, nil, `null`, 400, httpapi.CodeMalformedRequest},
		{"two objects", reclaimPath, nil, `{"unitIds":["u1"]}{"unitIds":["u2"],"dryRun":true}`, 400, httpapi.CodeMalformedRequest},
		{"trailing garbage", reclaimPath, nil, `{"unitIds":["u1"]} x`, 400, httpapi.CodeMalformedRequest},
		{"trailing bracket", reclaimPath, nil, `{"unitIds":["u1"]}]`, 400, httpapi.CodeMalformedRequest},
		{"body over 64 KiB", reclaimPath, nil, big, 413, httpapi.CodeBodyTooLarge},
		{"text/plain", reclaimPath, ptr("text/plain"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"no content type", reclaimPath, ptr(""), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"form content type", reclaimPath, ptr("application/x-www-form-urlencoded"), `unitIds=u1`, 415, httpapi.CodeUnsupportedMediaType},
		{"unparsable content type", reclaimPath, ptr("application/json; ;"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"release unknown field", releasePath, nil, `{"unitIds":["u1"],"dryrun":true}`, 400, httpapi.CodeMalformedRequest},
		{"release text/plain", releasePath, ptr("text/plain"), `{"unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
		{"release too large", releasePath, nil, big, 413, httpapi.CodeBodyTooLarge},
		{"placement unknown field", vmsPath, nil, `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"],"force":1}`, 400, httpapi.CodeMalformedRequest},
		{"placement case variant", vmsPath, nil, `{"vmid":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"placement wrong type", vmsPath, nil, `{"vmId":"v","orgId":"o","tier":1,"unitIds":["u1"]}`, 400, httpapi.CodeMalformedRequest},
		{"placement no content type", vmsPath, ptr(""), `{"vmId":"v","orgId":"o","tier":"spot","unitIds":["u1"]}`, 415, httpapi.CodeUnsupportedMediaType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{}
			authz := "Bearer " + secretOwner
			if tt.path == vmsPath {
				authz = "Bearer " + secretOperator
			}
			w := req{method: http.MethodPost, path: tt.path, body: tt.body, contentType: tt.contentType, auth: &authz}.do(t, newHandler(svc))
			problem(t, w, tt.status, tt.code)
			assertNoCalls(t, svc)
		})
	}
}

func TestAcceptableBodiesReachTheService(t *testing.T) {
	atLimit := `{"unitIds":["u1"],"reason":"`
	atLimit += strings.Repeat("a", httpapi.MaxBodyBytes-len(atLimit)-2) + `"}`
	tests := []struct {
		name        string
		contentType string
		body        string
		want        capacity.CapacityRequest
	}{
		{"charset parameter", "application/json; charset=utf-8", `{"unitIds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"upper-case media type", "Application/JSON", `{"unitIds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"surrounding whitespace", "application/json", " \n{\"unitIds\":[\"u1\"],\"dryRun\":true}\n ",
			capacity.CapacityRequest{UnitIDs: []string{"u1"}, DryRun: true}},
		{"escaped member name is the same name", "application/json", `{"unit\u0049ds":["u1"]}`,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}}},
		{"exactly 64 KiB", "application/json", atLimit,
			capacity.CapacityRequest{UnitIDs: []string{"u1"}, Reason: strings.Repeat("a", httpapi.MaxBodyBytes-len(`{"unitIds":["u1"],"reason":""}`))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{capacity: &capacity.CapacityResult{}}
			w := req{method: http.MethodPost, path: reclaimPath, body: tt.body, contentType: &tt.contentType}.do(t, newHandler(svc))
			if w.Code != http.StatusOK {
				t.Fatalf("status = %d: %s", w.Code, w.Body.String())
			}
			calls := svc.Calls()
			if len(calls) != 1 {
				t.Fatalf("calls = %d, want 1", len(calls))
			}
			tt.want.NodeID, tt.want.ReservationID = "n1", "r1"
			if got := calls[0].Capacity; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("request = %+v, want %+v", got, tt.want)
			}
		})
	}
}
