package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

// redriveService is the fake service that also re-drives.
type redriveService struct {
	*fakeService
	result *capacity.RedriveResult
	err    error
	got    []string // nodeId, reservationId, reclaimId, request id of the last call
}

func (s *redriveService) Redrive(_ context.Context, _ capacity.Principal, nodeID, resID, opID string, meta capacity.RequestMeta) (*capacity.RedriveResult, error) {
	s.got = []string{nodeID, resID, opID, meta.RequestID}
	return s.result, s.err
}

func TestRedriveRoute(t *testing.T) {
	const path = "/v1/nodes/n1/reservations/r1/reclaims/rcl_1/retry"
	op := capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpPendingStart, Attempt: 2,
		VMIDs: []string{"s1", "s2"}, Outcomes: map[string]capacity.VMOutcome{
			"s1": {Outcome: capacity.OutcomeTerminated, Attempt: 1},
			"s2": {Outcome: capacity.OutcomeFailed, Error: "refused", Attempt: 1},
		}}
	tests := []struct {
		name       string
		method     string
		result     *capacity.RedriveResult
		err        error
		wantStatus int
		wantCode   string
	}{
		{name: "re-driven", method: http.MethodPost, result: &capacity.RedriveResult{Operation: op, Retried: []string{"s2"}}, wantStatus: http.StatusAccepted},
		{name: "nothing to retry", method: http.MethodPost, result: &capacity.RedriveResult{Operation: capacity.Operation{ID: "rcl_1", State: capacity.OpCompleted}, Retried: []string{}}, wantStatus: http.StatusOK},
		{name: "still running", method: http.MethodPost, err: capacity.Errorf(capacity.CodeOperationRunning, "running"), wantStatus: http.StatusConflict, wantCode: "operation_running"},
		{name: "not the caller's", method: http.MethodPost, err: capacity.Errorf(capacity.CodeNotFound, "reservation not found"), wantStatus: http.StatusNotFound, wantCode: "not_found"},
		{name: "audience", method: http.MethodPost, err: capacity.Errorf(capacity.CodeForbidden, "no"), wantStatus: http.StatusForbidden, wantCode: "forbidden"},
		{name: "wrong method", method: http.MethodGet, wantStatus: http.StatusMethodNotAllowed, wantCode: "method_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &redriveService{fakeService: &fakeService{}, result: tt.result, err: tt.err}
			rec := req{method: tt.method, path: path, header: map[string]string{"X-Request-Id": "req-9"}}.do(t, newHandler(svc))
			if rec.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tt.wantStatus, rec.Body)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if tt.wantCode != "" {
				if body["code"] != tt.wantCode {
					t.Fatalf("code = %v, want %s", body["code"], tt.wantCode)
				}
				return
			}
			if len(svc.got) != 4 || svc.got[0] != "n1" || svc.got[1] != "r1" || svc.got[2] != "rcl_1" || svc.got[3] == "" {
				t.Fatalf("service got %v", svc.got)
			}
			if body["id"] != "rcl_1" || body["state"] != string(tt.result.Operation.State) {
				t.Fatalf("body = %v", body)
			}
			if tt.wantStatus == http.StatusAccepted {
				// s2's failure belongs to the attempt before: it is pending again.
				vms := body["vms"].([]any)
				if body["attempt"] != float64(2) || vms[1].(map[string]any)["outcome"] != "pending" || vms[0].(map[string]any)["outcome"] != "terminated" {
					t.Fatalf("body = %v", body)
				}
			}
		})
	}
}
