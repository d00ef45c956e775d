package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
)

const scheduledPath = "/v1/nodes/n1/reservations/r1/scheduled-reclaims/srcl_1"

func cannedSchedule() *capacity.ScheduleResult {
	fired := now.Add(time.Hour)
	return &capacity.ScheduleResult{Scheduled: capacity.ScheduledReclaim{
		ID: "srcl_1", NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u2"}, GraceSeconds: 30,
		At: now.Add(time.Hour), State: capacity.ScheduledRefused, CreatorOrgID: "owner", CreatedAt: now,
		Code: capacity.CodeOutsideTerm, Detail: "reservation is outside its term", FiredAt: &fired,
	}}
}

func TestReclaimWithAt(t *testing.T) {
	at := "2026-11-02T01:00:00+01:00"
	wantAt := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		path, body string
		status     int
		code       capacity.Code
		method     string // the service method called, "" for none
	}{
		{"scheduled", reclaimPath, `{"unitIds":["u2"],"at":"` + at + `","graceSeconds":30}`, http.StatusAccepted, "", "ScheduleReclaim"},
		{"dry run answers today's plan", reclaimPath, `{"unitIds":["u2"],"at":"` + at + `","dryRun":true}`, http.StatusOK, "", "Reclaim"},
		{"not RFC 3339", reclaimPath, `{"unitIds":["u2"],"at":"tomorrow"}`, http.StatusUnprocessableEntity, capacity.CodeInvalidRequest, ""},
		{"empty", reclaimPath, `{"unitIds":["u2"],"at":""}`, http.StatusUnprocessableEntity, capacity.CodeInvalidRequest, ""},
		{"null", reclaimPath, `{"unitIds":["u2"],"at":null}`, http.StatusBadRequest, "malformed_request", ""},
		{"not a string", reclaimPath, `{"unitIds":["u2"],"at":5}`, http.StatusBadRequest, "malformed_request", ""},
		{"on a release", releasePath, `{"unitIds":["u2"],"at":"` + at + `"}`, http.StatusUnprocessableEntity, capacity.CodeInvalidRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{scheduled: cannedSchedule()}
			w := req{method: http.MethodPost, path: tc.path, body: tc.body, header: map[string]string{"Idempotency-Key": "k1"}}.do(t, newHandler(svc))
			if tc.code != "" {
				problem(t, w, tc.status, tc.code)
			} else if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			calls := svc.Calls()
			if tc.method == "" {
				if len(calls) != 0 {
					t.Fatalf("service called: %+v", calls)
				}
				return
			}
			if len(calls) != 1 || calls[0].Method != tc.method {
				t.Fatalf("calls = %+v, want one %s", calls, tc.method)
			}
			c := calls[0]
			if c.Capacity.IdempotencyKey != "k1" || c.Capacity.NodeID != "n1" || c.Capacity.ReservationID != "r1" {
				t.Errorf("request = %+v", c.Capacity)
			}
			if tc.method != "ScheduleReclaim" {
				if !c.Capacity.DryRun {
					t.Error("the dry run was not a dry run")
				}
				return
			}
			if !c.At.Equal(wantAt) || c.Capacity.GraceSeconds != 30 {
				t.Errorf("at = %v, grace %d", c.At, c.Capacity.GraceSeconds)
			}
			if loc := w.Header().Get("Location"); loc != scheduledPath {
				t.Errorf("Location = %q", loc)
			}
			m := jsonObject(t, w)
			for name, want := range map[string]string{"id": `"srcl_1"`, "state": `"refused"`, "at": `"2026-11-02T01:00:00Z"`,
				"code": `"outside_term"`, "graceSeconds": "30", "createdByOrgId": `"owner"`, "firedAt": `"2026-11-02T01:00:00Z"`} {
				if got := string(m[name]); got != want {
					t.Errorf("%s = %s, want %s", name, got, want)
				}
			}
			assertAbsent(t, m, "cancelledAt", "reclaimId")
		})
	}
}

func TestScheduledReclaimRoutes(t *testing.T) {
	for _, tc := range []struct {
		method, want string
	}{
		{http.MethodGet, "GetScheduledReclaim"},
		{http.MethodDelete, "CancelScheduledReclaim"},
	} {
		t.Run(tc.method, func(t *testing.T) {
			svc := &fakeService{scheduled: cannedSchedule()}
			w := req{method: tc.method, path: scheduledPath}.do(t, newHandler(svc))
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			calls := svc.Calls()
			if len(calls) != 1 || calls[0].Method != tc.want || calls[0].NodeID != "n1" || calls[0].ResID != "r1" || calls[0].ID != "srcl_1" {
				t.Fatalf("calls = %+v", calls)
			}
			var body map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body["id"] != "srcl_1" {
				t.Errorf("body = %s", w.Body)
			}
		})
	}
	w := req{method: http.MethodPut, path: scheduledPath}.do(t, newHandler(&fakeService{}))
	if got := w.Header().Get("Allow"); got != "DELETE, GET" {
		t.Errorf("Allow = %q", got)
	}
}

// TestListScheduledReclaims: GET .../scheduled-reclaims passes the page on and answers the
// page; a key that may neither reclaim nor (as operator) read gets the reservation's 404
// before its query is looked at.
func TestListScheduledReclaims(t *testing.T) {
	const listPath = "/v1/nodes/n1/reservations/r1/scheduled-reclaims"
	noCapacity := "Bearer " + secretNoPerm
	for _, tc := range []struct {
		name, query string
		auth        *string
		status      int
		code        capacity.Code
		page        capacity.PageRequest
	}{
		{"first page", "", nil, http.StatusOK, "", capacity.PageRequest{}},
		{"limit and cursor", "?limit=2&cursor=abc", nil, http.StatusOK, "", capacity.PageRequest{Limit: 2, Cursor: "abc"}},
		{"limit out of range", "?limit=101", nil, http.StatusUnprocessableEntity, capacity.CodeInvalidRequest, capacity.PageRequest{}},
		{"unknown parameter", "?state=scheduled", nil, http.StatusBadRequest, "malformed_request", capacity.PageRequest{}},
		{"key without reservation.capacity", "?state=scheduled", &noCapacity, http.StatusNotFound, capacity.CodeNotFound, capacity.PageRequest{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{scheduled: cannedSchedule()}
			w := req{method: http.MethodGet, path: listPath + tc.query, auth: tc.auth}.do(t, newHandler(svc))
			calls := svc.Calls()
			if tc.code != "" {
				problem(t, w, tc.status, tc.code)
				if len(calls) != 0 {
					t.Errorf("service called: %+v", calls)
				}
				return
			}
			if w.Code != tc.status {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if len(calls) != 1 || calls[0].Method != "ListScheduledReclaims" || calls[0].NodeID != "n1" || calls[0].ResID != "r1" || calls[0].Page != tc.page {
				t.Fatalf("calls = %+v", calls)
			}
			var body struct {
				ScheduledReclaims []map[string]any `json:"scheduledReclaims"`
				NextCursor        string           `json:"nextCursor"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || len(body.ScheduledReclaims) != 1 ||
				body.ScheduledReclaims[0]["id"] != "srcl_1" || body.ScheduledReclaims[0]["state"] != "refused" || body.NextCursor != "next-1" {
				t.Errorf("body = %s", w.Body)
			}
		})
	}
}

func TestSchedulingErrorsMapToTheirStatus(t *testing.T) {
	for code, status := range map[capacity.Code]int{
		capacity.CodeSchedulingUnavailable:     http.StatusNotImplemented,
		capacity.CodeScheduledReclaimFired:     http.StatusConflict,
		capacity.CodeScheduledReclaimCancelled: http.StatusConflict,
		capacity.CodeScheduledReclaimLimit:     http.StatusConflict,
	} {
		svc := &fakeService{err: capacity.Errorf(code, "no")}
		w := req{method: http.MethodDelete, path: scheduledPath}.do(t, newHandler(svc))
		problem(t, w, status, code)
		w = req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u2"],"at":"2027-01-01T00:00:00Z"}`}.do(t, newHandler(svc))
		problem(t, w, status, code)
	}
}
