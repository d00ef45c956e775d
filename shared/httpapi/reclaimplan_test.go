package httpapi_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

const reclaimPlanPath = reservationPath + "/reclaim-plan"

func TestReclaimPlanRoute(t *testing.T) {
	plan := &capacity.ReclaimPlan{Count: 2, UnitIDs: []string{"u2", "u1"}, CapacityResult: capacity.CapacityResult{
		DryRun: true, Terminated: []string{"s1"}, Skipped: []string{}, PlanETag: `"abc"`,
		Reservation: capacity.Reservation{ID: "r1", NodeID: "n1", Status: capacity.StatusActive},
	}}
	available := 1
	tests := []struct {
		name     string
		body     string
		err      error
		status   int
		code     capacity.Code
		wantCall capacity.ReclaimPlanRequest
	}{
		{"a plan", `{"count":2,"reason":"need","graceSeconds":30}`, nil, http.StatusOK, "",
			capacity.ReclaimPlanRequest{NodeID: "n1", ReservationID: "r1", Count: 2, Reason: "need", GraceSeconds: 30}},
		{"more than available", `{"count":5}`, &capacity.Error{Code: capacity.CodeInsufficientUnits, Message: "no", Available: &available},
			http.StatusUnprocessableEntity, capacity.CodeInsufficientUnits, capacity.ReclaimPlanRequest{NodeID: "n1", ReservationID: "r1", Count: 5}},
		{"unit ids are not a plan's", `{"count":1,"unitIds":["u1"]}`, nil, http.StatusBadRequest, "malformed_request", capacity.ReclaimPlanRequest{}},
		{"no dry-run flag either", `{"count":1,"dryRun":true}`, nil, http.StatusBadRequest, "malformed_request", capacity.ReclaimPlanRequest{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeService{plan: plan, err: tt.err}
			w := req{method: "POST", path: reclaimPlanPath, body: tt.body}.do(t, newHandler(svc))
			calls := svc.Calls()
			if tt.wantCall.NodeID == "" {
				if len(calls) != 0 {
					t.Errorf("calls = %+v, want none", calls)
				}
			} else if len(calls) != 1 || calls[0].Method != "PlanReclaim" || calls[0].Plan != tt.wantCall {
				t.Errorf("calls = %+v, want PlanReclaim %+v", calls, tt.wantCall)
			}
			if tt.code != "" {
				p := problem(t, w, tt.status, tt.code)
				if tt.code == capacity.CodeInsufficientUnits && (p.Available == nil || *p.Available != available) {
					t.Errorf("available = %v, want %d", p.Available, available)
				}
				return
			}
			if w.Code != tt.status {
				t.Fatalf("status = %d: %s", w.Code, w.Body.String())
			}
			if got := w.Header().Get("ETag"); got != plan.PlanETag {
				t.Errorf("ETag = %q, want %q", got, plan.PlanETag)
			}
			var body struct {
				Count          int      `json:"count"`
				UnitIDs        []string `json:"unitIds"`
				WouldTerminate []string `json:"wouldTerminate"`
				WouldSkip      []string `json:"wouldSkip"`
				PlanETag       string   `json:"planEtag"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Count != 2 || !slices.Equal(body.UnitIDs, plan.UnitIDs) || !slices.Equal(body.WouldTerminate, []string{"s1"}) ||
				body.WouldSkip == nil || body.PlanETag != plan.PlanETag {
				t.Errorf("body = %s", w.Body.String())
			}
		})
	}
}
