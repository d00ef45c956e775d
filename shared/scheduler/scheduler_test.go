package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"

	"github.com/openrelay/capacity/shared/capacity"
	sched "github.com/openrelay/capacity/shared/scheduler"
)

// answer is one canned wire answer of the fake endpoint.
type answer struct {
	status  int
	errType string // X-Amzn-ErrorType, as AWS names the error
}

// fakeAWS answers every request with the next canned answer (then 200 {}), recording each
// request as it went on the wire: nothing leaves the process.
type fakeAWS struct {
	mu       sync.Mutex
	answers  []answer
	requests []recorded
}

type recorded struct {
	method, path string
	body         map[string]any
}

func (f *fakeAWS) Do(r *http.Request) (*http.Response, error) {
	var b []byte
	if r.Body != nil { // DELETE has none
		b, _ = io.ReadAll(r.Body)
	}
	var body map[string]any
	_ = json.Unmarshal(b, &body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, recorded{r.Method, r.URL.Path, body})
	a := answer{status: 200}
	if len(f.answers) > 0 {
		a, f.answers = f.answers[0], f.answers[1:]
	}
	h := http.Header{"Content-Type": {"application/json"}}
	out := `{"ScheduleArn":"arn:aws:scheduler:us-east-1:111111111111:schedule/g/x"}`
	if a.errType != "" {
		h.Set("X-Amzn-ErrorType", a.errType)
		out = `{"Message":"injected ` + a.errType + `"}`
	}
	return &http.Response{StatusCode: a.status, Header: h, Body: io.NopCloser(strings.NewReader(out)), Request: r}, nil
}

func newSchedules(f *fakeAWS) *sched.Schedules {
	client := scheduler.New(scheduler.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("https://scheduler.test"),
		Credentials:  credentials.NewStaticCredentialsProvider("k", "s", ""),
		HTTPClient:   f,
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.MaxBackoff = time.Millisecond
		}),
	})
	return &sched.Schedules{Client: client, Group: "capacity-test",
		RoleARN: "arn:aws:iam::111111111111:role/sched", BusARN: "arn:aws:events:us-east-1:111111111111:event-bus/capacity-test"}
}

var sr = capacity.ScheduledReclaim{
	ID: "srcl_abc", NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u2"},
	At: time.Date(2027, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)),
}

func TestCreateSendsTheOneTimeSchedule(t *testing.T) {
	f := &fakeAWS{}
	if err := newSchedules(f).Create(context.Background(), sr); err != nil {
		t.Fatal(err)
	}
	if len(f.requests) != 1 {
		t.Fatalf("requests = %d, want 1", len(f.requests))
	}
	r := f.requests[0]
	if r.method != http.MethodPost || r.path != "/schedules/srcl_abc" {
		t.Errorf("request %s %s, want POST /schedules/srcl_abc", r.method, r.path)
	}
	b := r.body
	want := map[string]any{
		"GroupName":                  "capacity-test",
		"ScheduleExpression":         "at(2027-01-02T02:04:05)", // in UTC
		"ScheduleExpressionTimezone": "UTC",
		"ActionAfterCompletion":      "DELETE",
		"ClientToken":                "srcl_abc",
	}
	for k, v := range want {
		if b[k] != v {
			t.Errorf("%s = %v, want %v", k, b[k], v)
		}
	}
	if m := b["FlexibleTimeWindow"].(map[string]any); m["Mode"] != "OFF" {
		t.Errorf("FlexibleTimeWindow = %v", m)
	}
	target := b["Target"].(map[string]any)
	if target["Arn"] != "arn:aws:events:us-east-1:111111111111:event-bus/capacity-test" || target["RoleArn"] != "arn:aws:iam::111111111111:role/sched" {
		t.Errorf("target = %v", target)
	}
	ebp := target["EventBridgeParameters"].(map[string]any)
	if ebp["DetailType"] != "Capacity Reclaim Requested" || ebp["Source"] != "openrelay.capacity.schedule" {
		t.Errorf("EventBridgeParameters = %v", ebp)
	}
	var input map[string]any
	if err := json.Unmarshal([]byte(target["Input"].(string)), &input); err != nil {
		t.Fatal(err)
	}
	if len(input) != 3 || input["nodeId"] != "n1" || input["reservationId"] != "r1" || input["scheduledReclaimId"] != "srcl_abc" {
		t.Errorf("Input = %v", input)
	}
}

func TestAnswersAWSGives(t *testing.T) {
	for _, tc := range []struct {
		name     string
		call     func(*sched.Schedules) error
		answers  []answer
		wantErr  bool
		attempts int
		throttle bool // the error is capacity.ErrThrottled
	}{
		{"create conflict is the schedule from a lost answer", createCall, []answer{{409, "ConflictException"}}, false, 1, false},
		{"create throttled then ok", createCall, []answer{{400, "ThrottlingException"}}, false, 2, false},
		{"create throttled throughout", createCall, []answer{{400, "ThrottlingException"}, {400, "ThrottlingException"}, {400, "ThrottlingException"}}, true, 3, true},
		{"create refused", createCall, []answer{{400, "ValidationException"}}, true, 1, false},
		{"delete of a missing schedule", deleteCall, []answer{{404, "ResourceNotFoundException"}}, false, 1, false},
		{"delete throttled then ok", deleteCall, []answer{{400, "ThrottlingException"}}, false, 2, false},
		{"delete conflict is an error", deleteCall, []answer{{409, "ConflictException"}}, true, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAWS{answers: tc.answers}
			err := tc.call(newSchedules(f))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if errors.Is(err, capacity.ErrThrottled) != tc.throttle {
				t.Errorf("err = %v; throttled: want %v", err, tc.throttle)
			}
			if len(f.requests) != tc.attempts {
				t.Errorf("attempts = %d, want %d", len(f.requests), tc.attempts)
			}
		})
	}
}

func createCall(s *sched.Schedules) error { return s.Create(context.Background(), sr) }

func deleteCall(s *sched.Schedules) error { return s.Delete(context.Background(), sr) }

func TestDeleteNamesTheSchedule(t *testing.T) {
	f := &fakeAWS{}
	if err := newSchedules(f).Delete(context.Background(), sr); err != nil {
		t.Fatal(err)
	}
	if r := f.requests[0]; r.method != http.MethodDelete || r.path != "/schedules/srcl_abc" {
		t.Errorf("request %s %s", r.method, r.path)
	}
}
