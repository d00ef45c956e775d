package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/awsfault"
)

// kumoScope marks the emulator's own service-to-service calls (its Step Functions engine's,
// API Gateway's and EventBridge's Lambda invokes); SDK clients sign as someone else.
const kumoScope = "Credential=kumo/"

// maxBody is the most of a request body the model reads to price it.
const maxBody = 4 << 20

// Handle applies the quotas to one request on its way to the emulator. It answers a throttled
// request itself (handled true), holds back a request the service delays, and returns release,
// to call when the request's answer is back (it ends a synchronous invoke's claim on
// concurrency). A request the model does not price passes untouched.
func (m *Model) Handle(w http.ResponseWriter, r *http.Request) (handled bool, release func()) {
	release = func() {}
	switch {
	case strings.Contains(r.Host, ".execute-api."):
		return m.apiRequest(w, r), release
	case strings.HasPrefix(r.URL.Path, "/_runtime/"):
		m.runtimeCall(r)
		return false, release
	case strings.HasPrefix(r.URL.Path, "/2015-03-31/functions/") && strings.HasSuffix(r.URL.Path, "/invocations") && r.Method == http.MethodPost:
		return m.invoke(w, r)
	}
	target := r.Header.Get("X-Amz-Target")
	service, op, ok := strings.Cut(target, ".")
	if !ok {
		return false, release
	}
	switch {
	case strings.HasPrefix(service, "DynamoDB_"):
		return m.dynamo(w, r, op), release
	case service == "AWSStepFunctions" && op == "StartExecution":
		return m.startExecution(w, r), release
	case service == "AWSEvents" && op == "PutEvents":
		if !m.bucket(EventsPutEvents, "").Take(1) {
			m.throttled(EventsPutEvents)
			writeAnswer(w, awsfault.ThrottlingAnswer("EventBridge"), "application/x-amz-json-1.1")
			return true, release
		}
	case service == "AmazonSQS" && op == "SendMessage" && r.Header.Get("Authorization") == "":
		// EventBridge delivering a matched event to a queue target (the emulator does not sign
		// it): a rule invocation, which AWS delays past the quota rather than refuses.
		m.wait(r.Context(), EventsRuleInvocations, m.bucket(EventsRuleInvocations, ""), 1)
	}
	return false, release
}

// WaitSchedulerInvocation holds a schedule's firing until the Scheduler's invocation quota
// lets it through, as Scheduler delays invocations past its quota.
func (m *Model) WaitSchedulerInvocation(ctx context.Context) {
	m.wait(ctx, SchedulerInvocations, m.bucket(SchedulerInvocations, ""), 1)
}

func (m *Model) wait(ctx context.Context, id ID, b *Bucket, cost float64) {
	d := b.Reserve(cost)
	if d <= 0 {
		return
	}
	m.delayed(id, d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// readBody reads the request body and puts it back for the emulator.
func readBody(r *http.Request) []byte {
	if r.Body == nil {
		return nil
	}
	data, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(data))
	return data
}

// apiRequest applies the account's throttle and the stage's (its default method throttle):
// API Gateway answers 429 {"message":"Too Many Requests"} past either.
func (m *Model) apiRequest(w http.ResponseWriter, r *http.Request) bool {
	apiID, _, _ := strings.Cut(r.Host, ".execute-api.")
	stageName, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	buckets := []*Bucket{m.bucket(APIGatewayAccount, "")}
	costs := []float64{1}
	ids := []ID{APIGatewayAccount}
	if st, ok := m.stages[apiID+"/"+stageName]; ok && st.Rate > 0 {
		buckets = append(buckets, m.bucketOf(StageThrottle, apiID+"/"+stageName, st.Burst, st.Rate))
		costs = append(costs, 1)
		ids = append(ids, StageThrottle)
	}
	if failed := takeAll(buckets, costs); failed != nil {
		m.throttled(ids[failed[0]], "stage", stageName)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"message":"Too Many Requests"}`))
		return true
	}
	return false
}

// StageThrottle is the API Gateway stage throttle: the template's, not a row of Defaults.
const StageThrottle ID = "apigateway.stage"

// runtimeCall follows executions on the runtime API: an invocation's response or error ends it.
func (m *Model) runtimeCall(r *http.Request) {
	if r.Method != http.MethodPost {
		return
	}
	// /_runtime/<fn>/2018-06-01/runtime/invocation/<id>/(response|error)
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/_runtime/"), "/")
	if len(parts) == 6 && parts[3] == "invocation" && (parts[5] == "response" || parts[5] == "error") {
		m.conc.ended(parts[0], parts[4])
	}
}

// ExecutionStarted records an invocation handed to a bootstrap of fn (the answer to its
// runtime API's next call, with the invocation's request id).
func (m *Model) ExecutionStarted(fn, requestID string) {
	m.conc.started(fn, requestID, m.now())
}

// invoke applies Lambda's concurrency to synchronous invokes, EventBridge's invocation quota
// to its deliveries, and Step Functions' state transitions to its engine's task invokes.
func (m *Model) invoke(w http.ResponseWriter, r *http.Request) (bool, func()) {
	fn := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2015-03-31/functions/"), "/invocations")
	if i := strings.Index(fn, ":function:"); i >= 0 {
		fn = fn[i+len(":function:"):]
	}
	kumo := strings.Contains(r.Header.Get("Authorization"), kumoScope)
	typ := r.Header.Get("X-Amz-Invocation-Type")
	if typ == "Event" {
		// Asynchronous invokes are queued by Lambda, never refused for concurrency; the
		// emulator's are EventBridge's rule deliveries.
		if kumo {
			m.wait(r.Context(), EventsRuleInvocations, m.bucket(EventsRuleInvocations, ""), 1)
		}
		return false, func() {}
	}
	if kumo && typ == "" {
		// The Step Functions engine's task: the transitions that led to it are charged
		// first, and AWS delays an execution past the quota rather than failing it.
		var payload map[string]any
		_ = json.Unmarshal(readBody(r), &payload)
		if cost, ok := m.transitionsOf(fn, payload); ok {
			m.wait(r.Context(), SFNStateTransitions, m.bucket(SFNStateTransitions, ""), cost)
		}
	}
	if !m.applies(LambdaConcurrency) {
		return false, func() {}
	}
	inv, reason := m.conc.admit(fn, m.now())
	if reason != "" {
		m.throttled(LambdaConcurrency, "function", fn, "reason", reason)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(map[string]any{"Type": "User", "message": "Rate Exceeded.", "Reason": reason})
		return true, func() {}
	}
	return false, func() { m.conc.done(inv) }
}

// startExecution applies StartExecution's bucket of the state machine's type.
func (m *Model) startExecution(w http.ResponseWriter, r *http.Request) bool {
	var in struct{ StateMachineArn string }
	_ = json.Unmarshal(readBody(r), &in)
	id := SFNStandardStart
	if m.machines[in.StateMachineArn] == "EXPRESS" {
		id = SFNExpressStart
	}
	if m.bucket(id, "").Take(1) {
		return false
	}
	m.throttled(id, "stateMachine", in.StateMachineArn)
	writeAnswer(w, awsfault.ThrottlingAnswer("SFN"), "application/x-amz-json-1.0")
	return true
}

// dynamo prices a DynamoDB request against its partitions and tables, and answers a throttle
// as DynamoDB does.
func (m *Model) dynamo(w http.ResponseWriter, r *http.Request, op string) bool {
	var req ddbRequest
	if json.Unmarshal(readBody(r), &req) != nil {
		return false
	}
	charges, provisioned := m.price(op, &req)
	if len(charges) == 0 {
		return false
	}
	buckets := make([]*Bucket, len(charges))
	costs := make([]float64, len(charges))
	for i, c := range charges {
		buckets[i], costs[i] = c.bucket, c.cost
	}
	failed := takeAll(buckets, costs)
	if failed == nil {
		return false
	}
	m.throttled(charges[failed[0]].id, "operation", op, "table", req.TableName)
	switch {
	case op == "TransactWriteItems" || op == "TransactGetItems":
		code := awsfault.ReasonThrottlingError
		msg := awsfault.DynamoThrottlingMessage
		if provisioned {
			code, msg = awsfault.ReasonProvisionedThroughputExceeded, awsfault.ProvisionedThroughputMessage
		}
		// Each action whose partition (or table) ran out carries the reason.
		codes := map[int]string{}
		for _, i := range failed {
			codes[charges[i].action] = code
		}
		writeAnswer(w, awsfault.CancelledAnswer(len(req.TransactItems), codes, msg), "application/x-amz-json-1.0")
	case provisioned:
		writeAnswer(w, awsfault.ProvisionedThroughputAnswer(), "application/x-amz-json-1.0")
	default:
		writeAnswer(w, awsfault.ThrottlingAnswer(dynamodb.ServiceID), "application/x-amz-json-1.0")
	}
	return true
}

func writeAnswer(w http.ResponseWriter, a awsfault.Answer, contentType string) {
	b, _ := json.Marshal(a.Body)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("X-Amzn-Requestid", "quota-throttle")
	w.WriteHeader(a.Status)
	_, _ = w.Write(b)
}
