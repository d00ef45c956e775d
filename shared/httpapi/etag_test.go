package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
)

// ---------------------------------------------------------------------------------------
// Plan ETags on reclaims.

func dryRunPlan(etag string) *capacity.CapacityResult {
	return &capacity.CapacityResult{Reservation: reservation(nil, nil), DryRun: true, Terminated: []string{"vm-1"}, Skipped: []string{}, PlanETag: etag}
}

func TestDryRunAnswersThePlanETag(t *testing.T) {
	const etag = `"0123456789abcdef0123456789abcdef"`
	for _, tc := range []struct {
		name     string
		body     string
		canned   *capacity.CapacityResult
		wantETag string
	}{
		{"dry run", `{"unitIds":["u1"],"dryRun":true}`, dryRunPlan(etag), etag},
		{"dry run with at", `{"unitIds":["u1"],"dryRun":true,"at":"2027-01-01T00:00:00Z"}`, dryRunPlan(etag), etag},
		{"real reclaim: no ETag", `{"unitIds":["u1"]}`, &capacity.CapacityResult{Reservation: reservation(nil, nil), PlanETag: etag}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{capacity: tc.canned}
			q := req{method: http.MethodPost, path: reclaimPath, body: tc.body}
			w := q.do(t, newHandler(svc))
			checkDocument(t, q, w)
			if w.Code != 200 || w.Header().Get("ETag") != tc.wantETag {
				t.Fatalf("status %d, ETag %q, want %q: %s", w.Code, w.Header().Get("ETag"), tc.wantETag, w.Body.String())
			}
			m := jsonObject(t, w)
			if tc.wantETag == "" {
				assertAbsent(t, m, "planEtag")
			} else if string(m["planEtag"]) != fmt.Sprintf("%q", etag) {
				t.Errorf("planEtag = %s, want %q", m["planEtag"], etag)
			}
		})
	}
}

// TestIfMatchIsPassedOn: the header reaches the domain as sent (several lines joined into one
// list, as RFC 9110 reads them); the domain compares.
func TestIfMatchIsPassedOn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string
	}{
		{"none", nil, ""},
		{"one", []string{`"abc"`}, `"abc"`},
		{"weak", []string{`W/"abc"`}, `W/"abc"`},
		{"star", []string{`*`}, `*`},
		{"a list", []string{`"a", "b"`}, `"a", "b"`},
		{"two lines", []string{`"a"`, `"b"`}, `"a", "b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			w := serve(newHandler(svc), reclaimIfMatch(secretOwner, tc.values))
			calls := svc.Calls()
			if w.Code != 200 || len(calls) != 1 || calls[0].Capacity.IfMatch != tc.want {
				t.Errorf("status %d, calls %+v, want IfMatch %q", w.Code, calls, tc.want)
			}
		})
	}
}

// TestMalformedIfMatchIsRefused: an If-Match that is not "*" or a list of quoted entity tags
// is the client's mistake: 400 malformed_request before the domain is called, never a 412
// (as if the plan had changed) nor a reclaim without a precondition (an empty value). The
// permission still comes first: a caller without it gets the 404 whatever the header.
func TestMalformedIfMatchIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"unquoted", []string{`abc`}},
		{"empty", []string{``}},
		{"only commas", []string{` , ,`}},
		{"star in a list", []string{`"a", *`}},
		{"unterminated", []string{`"abc`}},
		{"junk after a tag", []string{`"abc"x`}},
		{"a space inside", []string{`"a b"`}},
		{"weak unquoted", []string{`W/abc`}},
		{"one bad line of two", []string{`"a"`, `b`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{}
			w := serve(newHandler(svc), reclaimIfMatch(secretOwner, tc.values))
			if p := problem(t, w, http.StatusBadRequest, httpapi.CodeMalformedRequest); !strings.Contains(p.Detail, "If-Match") {
				t.Errorf("detail %q", p.Detail)
			}
			assertNoCalls(t, svc)
			problem(t, serve(newHandler(svc), reclaimIfMatch(secretNoPerm, tc.values)), http.StatusNotFound, capacity.CodeNotFound)
		})
	}
}

// reclaimIfMatch is a reclaim of u1 with the key's secret and each value as an If-Match line.
func reclaimIfMatch(secret string, values []string) *http.Request {
	r := httptestRequest(http.MethodPost, reclaimPath, `{"unitIds":["u1"]}`)
	r.Header.Set("Authorization", "Bearer "+secret)
	for _, v := range values {
		r.Header.Add("If-Match", v)
	}
	return r
}

// TestIfMatchWithoutAPlanIsRefused: a release, or a reclaim scheduled for later, has no plan
// of now to match: If-Match there is refused, not ignored.
func TestIfMatchWithoutAPlanIsRefused(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{releasePath, `{"unitIds":["u1"]}`},
		{reclaimPath, `{"unitIds":["u1"],"at":"2027-01-01T00:00:00Z"}`},
	} {
		t.Run(tc.path+" "+tc.body, func(t *testing.T) {
			svc := &fakeService{}
			w := req{method: http.MethodPost, path: tc.path, body: tc.body, header: map[string]string{"If-Match": `"abc"`}}.do(t, newHandler(svc))
			if p := problem(t, w, 422, capacity.CodeInvalidRequest); !strings.Contains(p.Detail, "If-Match") {
				t.Errorf("detail %q", p.Detail)
			}
			assertNoCalls(t, svc)
		})
	}
}

// TestPlanChangedAnswersTheNewPlan: 412 with the new plan as a dry run shows it, and its tag
// in ETag.
func TestPlanChangedAnswersTheNewPlan(t *testing.T) {
	const etag = `"ffffffffffffffffffffffffffffffff"`
	plan := dryRunPlan(etag)
	plan.DryRun = false // the problem shows it as a dry run whatever the domain set
	svc := &fakeService{err: fmt.Errorf("reclaim: %w", &capacity.Error{Code: capacity.CodePlanChanged, Message: "the plan has changed", Plan: plan})}
	q := req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`, header: map[string]string{"If-Match": `"old"`}}
	w := q.do(t, newHandler(svc))
	p := problem(t, w, http.StatusPreconditionFailed, capacity.CodePlanChanged)
	checkDocument(t, q, w)
	if w.Header().Get("ETag") != etag {
		t.Errorf("ETag %q, want %q", w.Header().Get("ETag"), etag)
	}
	if p.Plan == nil || p.Plan.PlanETag != etag || p.Plan.WouldTerminate == nil || (*p.Plan.WouldTerminate)[0] != "vm-1" ||
		p.Plan.Terminated != nil || p.Plan.ID != "r1" {
		t.Errorf("plan %+v", p.Plan)
	}
	// Any other problem has neither.
	svc = &fakeService{err: capacity.Errorf(capacity.CodeOutsideTerm, "no")}
	w = req{method: http.MethodPost, path: reclaimPath, body: `{"unitIds":["u1"]}`}.do(t, newHandler(svc))
	if problem(t, w, 409, capacity.CodeOutsideTerm); w.Header().Get("ETag") != "" || strings.Contains(w.Body.String(), "plan") {
		t.Errorf("ETag %q, body %s", w.Header().Get("ETag"), w.Body.String())
	}
}

// httptestRequest is a JSON request with the owner's key.
func httptestRequest(method, path, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+secretOwner)
	r.Header.Set("Content-Type", "application/json")
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
