package quota

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/smithy-go"
)

// clock is a test clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_700_000_000, 0)} }

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestBucket(t *testing.T) {
	type step struct {
		after time.Duration
		cost  float64
		want  bool
	}
	cases := []struct {
		name       string
		size, rate float64
		steps      []step
	}{
		{"a full bucket serves its size at once, then nothing", 3, 1, []step{{0, 1, true}, {0, 1, true}, {0, 1, true}, {0, 1, false}}},
		{"it refills at its rate", 2, 2, []step{{0, 2, true}, {0, 1, false}, {500 * time.Millisecond, 1, true}, {0, 1, false}}},
		{"it never holds more than its size", 2, 10, []step{{time.Hour, 2, true}, {0, 1, false}}},
		{"a cost above the size passes on a full bucket and leaves it in debt", 1, 1, []step{{0, 3, true}, {time.Second, 1, false}, {2 * time.Second, 1, true}}},
		{"a fractional refill (a scaled-down rate) adds up", 1, 0.25, []step{{0, 1, true}, {2 * time.Second, 1, false}, {2 * time.Second, 1, true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			b := NewBucket(c.size, c.rate, clk.now)
			for i, s := range c.steps {
				clk.advance(s.after)
				if got := b.Take(s.cost); got != s.want {
					t.Fatalf("step %d: Take(%v) = %v, want %v", i, s.cost, got, s.want)
				}
			}
		})
	}
}

func TestReserveReturnsTheWaitForTheTokens(t *testing.T) {
	clk := newClock()
	b := NewBucket(2, 4, clk.now)
	for i, want := range []time.Duration{0, 0, 250 * time.Millisecond, 500 * time.Millisecond} {
		if got := b.Reserve(1); got != want {
			t.Fatalf("reservation %d waits %v, want %v", i, got, want)
		}
	}
}

func TestTakeAllIsAllOrNothing(t *testing.T) {
	clk := newClock()
	full, empty := NewBucket(5, 1, clk.now), NewBucket(1, 1, clk.now)
	empty.Take(1)
	if failed := takeAll([]*Bucket{full, empty}, []float64{2, 1}); len(failed) != 1 || failed[0] != 1 {
		t.Fatalf("takeAll = %v, want the empty bucket [1]", failed)
	}
	if !full.Take(5) {
		t.Fatal("the full bucket lost tokens to a request another bucket refused")
	}
	// A bucket charged twice is charged the sum, and only the charge that overflows it fails.
	shared := NewBucket(5, 1, clk.now)
	shared.Take(1)
	if failed := takeAll([]*Bucket{shared, shared}, []float64{2, 3}); len(failed) != 1 || failed[0] != 1 {
		t.Fatalf("charges of 2 and 3 on a bucket holding 4: failed %v, want [1]", failed)
	}
	if failed := takeAll([]*Bucket{shared, shared}, []float64{2, 2}); failed != nil {
		t.Fatalf("charges of 2 and 2 on a bucket holding 4 failed: %v", failed)
	}
}

func TestScaleDividesEveryBucketAndLimit(t *testing.T) {
	m, err := New(Config{Region: "eu-west-1", Scale: 100}, Resources{
		Functions: []Function{{Name: "api", Reserved: 300}},
	}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	b := m.bucket(SFNStandardStart, "")
	if b.Size() != 13 || b.Rate() != 3 {
		t.Errorf("StartExecution at scale 100: bucket %v refill %v, want 13 and 3", b.Size(), b.Rate())
	}
	if b := m.bucket(DynamoPartitionWrite, "t//S:x"); b.Size() != 10 || b.Rate() != 10 {
		t.Errorf("partition WCU at scale 100: bucket %v refill %v, want 10 and 10", b.Size(), b.Rate())
	}
	if got := m.conc.reserved["api"]; got != 3 {
		t.Errorf("reserved concurrency 300 at scale 100 = %d, want 3", got)
	}
	if m.conc.unreserved != 7 {
		t.Errorf("unreserved pool = %d, want 1000/100 - 3 = 7", m.conc.unreserved)
	}
	if _, err := New(Config{Region: "mars-1", Scale: 1}, Resources{}, nil, nil); err == nil {
		t.Error("a region without rows was accepted")
	}
}

// terminationDefinition has the shape of the termination workflow: two tasks, a Wait, a task
// looping through a Choice and a Wait, a last task.
const terminationDefinition = `{"StartAt":"NotifyAgents","States":{
 "NotifyAgents":{"Type":"Task","Resource":"arn:aws:states:::lambda:invoke","Next":"Notify","Catch":[{"ErrorEquals":["States.ALL"],"Next":"Notify"}],
   "Parameters":{"FunctionName":"arn:aws:lambda:us-east-1:000000000000:function:term","Payload":{"agentNotices":true,"nodeId.$":"$.nodeId"}}},
 "Notify":{"Type":"Task","Resource":"arn:aws:states:::lambda:invoke","Next":"GracePeriod",
   "Parameters":{"FunctionName":"arn:aws:lambda:us-east-1:000000000000:function:events","Payload":{"phase":"notice"}}},
 "GracePeriod":{"Type":"Wait","TimestampPath":"$.terminateAfter","Next":"TerminateNode"},
 "TerminateNode":{"Type":"Task","Resource":"arn:aws:states:::lambda:invoke","Next":"AllTerminated?",
   "Parameters":{"FunctionName":"arn:aws:lambda:us-east-1:000000000000:function:term","Payload":{"maxRounds":5,"round.$":"$.round"}}},
 "BeforeNextRound":{"Type":"Wait","Seconds":2,"Next":"TerminateNode"},
 "AllTerminated?":{"Type":"Choice","Choices":[{"Variable":"$.done","BooleanEquals":true,"Next":"Report"}],"Default":"BeforeNextRound"},
 "Report":{"Type":"Task","Resource":"arn:aws:states:::lambda:invoke","End":true,
   "Parameters":{"FunctionName":"arn:aws:lambda:us-east-1:000000000000:function:events","Payload":{"phase":"report"}}}}}`

func TestStateTransitionsPerTask(t *testing.T) {
	m, err := New(Config{Region: "eu-west-1", Scale: 1}, Resources{StateMachines: []StateMachine{
		{ARN: "arn:sm", Type: "STANDARD", Definition: terminationDefinition},
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		task    string
		fn      string
		payload map[string]any
		want    float64
	}{
		{"NotifyAgents: the first state", "term", map[string]any{"agentNotices": true, "nodeId": "n"}, 1},
		{"Notify: right after a task", "events", map[string]any{"phase": "notice"}, 1},
		{"TerminateNode: after the grace Wait", "term", map[string]any{"maxRounds": float64(5), "round": float64(1)}, 2},
		{"Report: after the Choice", "events", map[string]any{"phase": "report"}, 2},
	}
	total := 0.0
	for _, c := range cases {
		got, ok := m.transitionsOf(c.fn, c.payload)
		if !ok || got != c.want {
			t.Errorf("%s: %v transitions (matched %v), want %v", c.task, got, ok, c.want)
		}
		total += got
	}
	if total != 6 {
		t.Errorf("a one-round run costs %v transitions, want 6", total)
	}
}

func TestSetValuesAndQueryPartition(t *testing.T) {
	values := map[string]any{":s": map[string]any{"S": "OPSTATE#terminating"}, ":t": map[string]any{"S": "2026"}, ":d": map[string]any{"S": "x"}}
	names := map[string]string{"#k": "gsi1pk"}
	got := setValues("SET #k = :s, gsi1sk = if_not_exists(gsi1sk, :t), other = list_append(other, :d) REMOVE foo", names, values)
	if keyValue(got["gsi1pk"]) != "S:OPSTATE#terminating" || keyValue(got["gsi1sk"]) != "S:2026" {
		t.Errorf("setValues = %v", got)
	}
	if _, ok := got["other"]; ok {
		t.Errorf("a computed value was taken for a plain one: %v", got)
	}
	if pk := queryPartition("#k = :s AND begins_with(gsi1sk, :t)", "gsi1pk", names, values); pk != "S:OPSTATE#terminating" {
		t.Errorf("queryPartition = %q", pk)
	}
}

// layerServer serves the quota layer in front of a stand-in for the emulator that answers
// every request it is passed with an empty success.
func layerServer(t *testing.T, m *Model) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled, release := m.Handle(w, r)
		defer release()
		if handled {
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/invocations"):
			w.WriteHeader(200)
			_, _ = w.Write([]byte(`{}`))
		case r.Header.Get("X-Amz-Target") == "AWSStepFunctions.StartExecution":
			_, _ = w.Write([]byte(`{"executionArn":"arn:x","startDate":1}`))
		case r.Header.Get("X-Amz-Target") == "AWSEvents.PutEvents":
			_, _ = w.Write([]byte(`{"FailedEntryCount":0,"Entries":[{"EventId":"1"}]}`))
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func sdkConfig(url string) aws.Config {
	return aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(url), RetryMaxAttempts: 1}
}

var testTables = []Table{
	{Name: "state", PartitionKey: "pk", Indexes: []Index{{Name: "byState", PartitionKey: "gsi1pk"}}},
	{Name: "prov", PartitionKey: "pk", Provisioned: true},
}

// TestThrottlesReachTheSDKAsAWSErrors drives each quota past its bucket with an SDK client and
// checks the typed error the SDK builds from the layer's answer.
func TestThrottlesReachTheSDKAsAWSErrors(t *testing.T) {
	ctx := context.Background()
	item := func(pk, gsi string) map[string]ddbtypes.AttributeValue {
		it := map[string]ddbtypes.AttributeValue{"pk": &ddbtypes.AttributeValueMemberS{Value: pk}, "sk": &ddbtypes.AttributeValueMemberS{Value: "s"}}
		if gsi != "" {
			it["gsi1pk"] = &ddbtypes.AttributeValueMemberS{Value: gsi}
		}
		return it
	}
	// Scale 1000: a partition takes 1 WCU, StartExecution 1.3, PutEvents 10, concurrency 1.
	cases := []struct {
		name string
		// first fills the quota (it must pass), second must fail with the error check accepts.
		first, second func(cfg aws.Config) error
		check         func(err error) string
	}{
		{"on-demand partition: ThrottlingException", func(cfg aws.Config) error {
			_, err := dynamodb.NewFromConfig(cfg).PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("state"), Item: item("KEY#1", "")})
			return err
		}, func(cfg aws.Config) error {
			_, err := dynamodb.NewFromConfig(cfg).PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("state"), Item: item("KEY#1", "")})
			return err
		}, func(err error) string {
			var te *ddbtypes.ThrottlingException
			if !errors.As(err, &te) {
				return "not a ThrottlingException"
			}
			return ""
		}},
		{"provisioned partition: ProvisionedThroughputExceededException", func(cfg aws.Config) error {
			_, err := dynamodb.NewFromConfig(cfg).PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("prov"), Item: item("A", "")})
			return err
		}, func(cfg aws.Config) error {
			_, err := dynamodb.NewFromConfig(cfg).DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String("prov"), Key: item("A", "")})
			return err
		}, func(err error) string {
			var pe *ddbtypes.ProvisionedThroughputExceededException
			if !errors.As(err, &pe) {
				return "not a ProvisionedThroughputExceededException"
			}
			return ""
		}},
		{"index partition of an update's SET value: ThrottlingError on that item of a transaction", func(cfg aws.Config) error {
			// Another node's item, the same index key: the index partition is now spent.
			_, err := dynamodb.NewFromConfig(cfg).PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String("state"), Item: item("OP#1", "OPSTATE#pending_start")})
			return err
		}, func(cfg aws.Config) error {
			_, err := dynamodb.NewFromConfig(cfg).TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []ddbtypes.TransactWriteItem{
				{Put: &ddbtypes.Put{TableName: aws.String("state"), Item: item("NODE#9", "")}},
				{Update: &ddbtypes.Update{TableName: aws.String("state"), Key: item("OP#2", ""),
					UpdateExpression:          aws.String("SET #k = :s"),
					ExpressionAttributeNames:  map[string]string{"#k": "gsi1pk"},
					ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":s": &ddbtypes.AttributeValueMemberS{Value: "OPSTATE#pending_start"}}}},
			}})
			return err
		}, func(err error) string {
			var tc *ddbtypes.TransactionCanceledException
			if !errors.As(err, &tc) || len(tc.CancellationReasons) != 2 {
				return "not a TransactionCanceledException with two reasons"
			}
			if c := aws.ToString(tc.CancellationReasons[0].Code); c != "None" {
				return "reason of the untouched item: " + c
			}
			if c := aws.ToString(tc.CancellationReasons[1].Code); c != "ThrottlingError" {
				return "reason of the index write: " + c
			}
			return ""
		}},
		{"StartExecution: ThrottlingException Rate exceeded", func(cfg aws.Config) error {
			_, err := sfn.NewFromConfig(cfg).StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String("arn:sm")})
			return err
		}, func(cfg aws.Config) error {
			_, err := sfn.NewFromConfig(cfg).StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String("arn:sm")})
			return err
		}, apiError("ThrottlingException", "Rate exceeded")},
		{"synchronous invoke past reserved concurrency: TooManyRequestsException", func(aws.Config) error {
			return nil // the invoke in flight is claimed below
		}, func(cfg aws.Config) error {
			_, err := lambda.NewFromConfig(cfg).Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("api")})
			return err
		}, func(err error) string {
			var tm *lambdatypes.TooManyRequestsException
			if !errors.As(err, &tm) {
				return "not a TooManyRequestsException"
			}
			if tm.Reason != lambdatypes.ThrottleReason(ReasonReserved) {
				return "reason " + string(tm.Reason)
			}
			return ""
		}},
		{"PutEvents: ThrottlingException", func(cfg aws.Config) error {
			for range 10 {
				if _, err := eventbridge.NewFromConfig(cfg).PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{Source: aws.String("s")}}}); err != nil {
					return err
				}
			}
			return nil
		}, func(cfg aws.Config) error {
			_, err := eventbridge.NewFromConfig(cfg).PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{Source: aws.String("s")}}})
			return err
		}, apiError("ThrottlingException", "Rate exceeded")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{Region: "eu-west-1", Scale: 1000}, Resources{Tables: testTables,
				Functions: []Function{{Name: "api", Reserved: 1}}}, nil, newClock().now)
			if err != nil {
				t.Fatal(err)
			}
			if _, reason := m.conc.admit("api", m.now()); reason != "" {
				t.Fatal("the first invoke was refused:", reason)
			}
			srv := layerServer(t, m)
			cfg := sdkConfig(srv.URL)
			if err := c.first(cfg); err != nil {
				t.Fatal("within the quota:", err)
			}
			err = c.second(cfg)
			if err == nil {
				t.Fatal("past the quota: no error")
			}
			if msg := c.check(err); msg != "" {
				t.Fatalf("%s: %v", msg, err)
			}
		})
	}
}

func apiError(code, msg string) func(error) string {
	return func(err error) string {
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != code || ae.ErrorMessage() != msg {
			return "not " + code + " " + msg
		}
		return ""
	}
}

func TestAPIStageThrottleAnswers429(t *testing.T) {
	m, err := New(Config{Region: "eu-west-1", Scale: 100}, Resources{Stages: []Stage{{APIID: "abc", Name: "prod", Rate: 500, Burst: 1000}}}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	srv := layerServer(t, m)
	get := func() (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/prod/v1/nodes", nil)
		req.Host = "abc.execute-api.localhost:4566"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 256)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	// The stage's burst of 1000 at scale 100: ten requests, then 429.
	for i := range 10 {
		if code, _ := get(); code != 200 {
			t.Fatalf("request %d within the burst: %d", i, code)
		}
	}
	code, body := get()
	if code != 429 || body != `{"message":"Too Many Requests"}` {
		t.Fatalf("past the burst: %d %s", code, body)
	}
	if m.Stats()[StageThrottle].Throttled != 1 {
		t.Errorf("stats: %+v", m.Stats())
	}
}

func TestScaleDividesOnlySharedPartitions(t *testing.T) {
	m, err := New(Config{Region: "eu-west-1", Scale: 50}, Resources{Tables: testTables}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		index, pk string
		want      float64 // the partition's WCU bucket and refill
	}{
		{"", "S:NODE#n1", 1000},                    // one node's items: one reclaim's
		{"", "S:NODE#n1#OP#o1", 1000},              // its operation
		{"byList", "S:NODE#n1#RES#r1#OPS", 1000},   // its reservation's list
		{"byState", "S:OPSTATE#pending_start", 20}, // a byState key every reclaim writes
		{"byList", "S:NODES", 20},                  // the node directory
		{"byList", "S:ORG#o#NODES", 20},            // an org's list
		{"", "S:KEY#k1", 20},                       // an API key's limiter item
	}
	for _, tc := range cases {
		c := m.writeCharges(0, "state", tc.index, tc.pk, 1)
		b := c[len(c)-1].bucket
		if c[len(c)-1].id != DynamoPartitionWrite || b.Size() != tc.want || b.Rate() != tc.want {
			t.Errorf("%s %s: bucket %v refill %v, want %v", tc.index, tc.pk, b.Size(), b.Rate(), tc.want)
		}
		if w := c[0].bucket; w.Size() != 80 {
			t.Errorf("%s %s: warm throughput %v, want 4000/50 (a table's is shared)", tc.index, tc.pk, w.Size())
		}
	}
	// A 64-VM node's reclaim: about 140 WCU on its own partition in one transaction passes
	// at once, as on AWS, where the shared index key's 20 WCU would not take it.
	own := m.writeCharges(0, "state", "", "S:NODE#big", 140)
	if !own[1].bucket.Take(140) {
		t.Error("one reclaim's 140 WCU on its own node's partition was throttled")
	}
}

func TestStageThrottleIsTheModelledEnvironments(t *testing.T) {
	stages := Resources{Stages: []Stage{{APIID: "abc", Name: "local", Rate: 100, Burst: 200}}}
	cases := []struct {
		name      string
		stage     *Throttle
		size, ref float64
	}{
		{"the template's (local) when none is named", nil, 4, 2},
		{"prod's over the template's", &Throttle{Rate: 2500, Burst: 5000}, 100, 50},
	}
	for _, tc := range cases {
		m, err := New(Config{Region: "eu-west-1", Scale: 50, Stage: tc.stage}, stages, nil, newClock().now)
		if err != nil {
			t.Fatal(err)
		}
		st := m.stages["abc/local"]
		b := m.bucketOf(StageThrottle, "abc/local", st.Burst, st.Rate)
		if b.Size() != tc.size || b.Rate() != tc.ref {
			t.Errorf("%s: bucket %v refill %v, want %v and %v", tc.name, b.Size(), b.Rate(), tc.size, tc.ref)
		}
	}
}

func TestModelledEnvironmentsScaleSettingsReplaceTheTemplates(t *testing.T) {
	cfg := Config{Region: "eu-west-1", Scale: 50, DurationRatio: 1, WarmWrite: 30000, WarmRead: 24000,
		Reserved: map[string]int{"api": 300, "terminate-node": 200}}
	m, err := New(cfg, Resources{Functions: []Function{{Name: "capacity-local-api"}, {Name: "capacity-local-terminate-node", Reserved: 5}, {Name: "capacity-local-events"}}}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	warm := []struct {
		id   ID
		key  string
		want float64
	}{
		{DynamoWarmWrite, "capacity-local-state/", 600},        // prod's 30,000 / 50
		{DynamoWarmWrite, "capacity-local-state/byState", 600}, // its indexes too
		{DynamoWarmRead, "capacity-local-state", 480},          // a scan's key: the table
		{DynamoWarmWrite, "capacity-local-audit/", 80},         // another table: a new table's 4,000
	}
	for _, tc := range warm {
		if b := m.bucket(tc.id, tc.key); b.Size() != tc.want || b.Rate() != tc.want {
			t.Errorf("%s %s: bucket %v refill %v, want %v", tc.id, tc.key, b.Size(), b.Rate(), tc.want)
		}
	}
	if m.conc.reserved["capacity-local-api"] != 6 || m.conc.reserved["capacity-local-terminate-node"] != 4 {
		t.Errorf("reserved: %v, want prod's 300 and 200 at scale 50", m.conc.reserved)
	}
	if _, ok := m.conc.reserved["capacity-local-events"]; ok {
		t.Error("a function prod reserves nothing for got a reservation")
	}
}

func TestConcurrencyLimitsAllowForTheLocalDurations(t *testing.T) {
	fns := Resources{Functions: []Function{{Name: "api", Reserved: 300}, {Name: "terminate-node", Reserved: 200}}}
	cases := []struct {
		ratio                  float64
		api, terminate, others int
	}{
		{0, 6, 4, 10},        // durations as on AWS: every limit divided by the whole scale
		{1, 6, 4, 10},        // the same, said
		{10, 60, 40, 100},    // ten times longer: divided by 5
		{50, 300, 200, 500},  // as long as the scale: AWS's own limits
		{200, 300, 200, 500}, // longer still: never above AWS's
	}
	for _, tc := range cases {
		m, err := New(Config{Region: "eu-west-1", Scale: 50, DurationRatio: tc.ratio}, fns, nil, newClock().now)
		if err != nil {
			t.Fatal(err)
		}
		if m.conc.reserved["api"] != tc.api || m.conc.reserved["terminate-node"] != tc.terminate || m.conc.unreserved != tc.others {
			t.Errorf("ratio %v: api %d terminate %d pool %d, want %d %d %d", tc.ratio,
				m.conc.reserved["api"], m.conc.reserved["terminate-node"], m.conc.unreserved, tc.api, tc.terminate, tc.others)
		}
	}
	if _, err := New(Config{Region: "eu-west-1", Scale: 50, DurationRatio: 0.5}, fns, nil, nil); err == nil {
		t.Error("a duration ratio below 1 was accepted")
	}
}

func TestFromEnvReadsTheModelledEnvironment(t *testing.T) {
	root := t.TempDir()
	cdk := `{"context":{"environments":{"prod":{"region":"eu-west-1","throttle":{"rate":2500,"burst":5000},"scale":{"warmWriteUnits":30000,"apiConcurrency":300}},"local":{"throttle":{"rate":100,"burst":200}}}}}`
	if err := os.WriteFile(filepath.Join(root, "cdk.json"), []byte(cdk), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvScale, "50")
	t.Setenv(EnvRegion, "")
	t.Setenv(EnvEnv, "")
	t.Setenv(EnvOnly, "")
	t.Setenv(EnvDurationRatio, "")
	c, err := FromEnv(root)
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != "eu-west-1" || c.Stage == nil || *c.Stage != (Throttle{Rate: 2500, Burst: 5000}) || c.DurationRatio != DefaultDurationRatio ||
		c.WarmWrite != 30000 || c.WarmRead != 0 || len(c.Reserved) != 1 || c.Reserved["api"] != 300 {
		t.Errorf("prod: %+v (stage %+v)", c, c.Stage)
	}
	t.Setenv(EnvDurationRatio, "1")
	if c, err := FromEnv(root); err != nil || c.DurationRatio != 1 {
		t.Errorf("ratio 1: %+v %v", c, err)
	}
	t.Setenv(EnvDurationRatio, "0.5")
	if _, err := FromEnv(root); err == nil {
		t.Error("a ratio below 1 was accepted")
	}
	t.Setenv(EnvDurationRatio, "")
	t.Setenv(EnvEnv, "local")
	if _, err := FromEnv(root); err == nil {
		t.Error("an environment without a region and no CAPACITY_QUOTA_REGION was accepted")
	}
	t.Setenv(EnvRegion, "us-east-1")
	if c, err := FromEnv(root); err != nil || c.Region != "us-east-1" || c.Stage == nil || c.Stage.Rate != 100 {
		t.Errorf("local in us-east-1: %+v %v", c, err)
	}
}

func TestAccountConcurrencyIsSharedByUnreservedFunctions(t *testing.T) {
	m, err := New(Config{Region: "us-east-1", Scale: 500}, Resources{Functions: []Function{{Name: "api", Reserved: 500}}}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	// 1000/500 = 2 account-wide, 1 of them reserved for api: the pool of the others is 1.
	first, reason := m.conc.admit("terminate", m.now())
	if reason != "" {
		t.Fatal(reason)
	}
	if _, reason := m.conc.admit("events", m.now()); reason != ReasonAccount {
		t.Fatalf("second unreserved invoke: %q, want %s", reason, ReasonAccount)
	}
	if _, reason := m.conc.admit("api", m.now()); reason != "" {
		t.Fatalf("api's reserved concurrency was taken by the others: %s", reason)
	}
	// The first one's execution runs, then ends: the pool is free again.
	m.ExecutionStarted("terminate", "req-1")
	m.conc.done(first)
	if _, reason := m.conc.admit("events", m.now()); reason != ReasonAccount {
		t.Fatal("a running execution did not count")
	}
	m.conc.ended("terminate", "req-1")
	if _, reason := m.conc.admit("events", m.now()); reason != "" {
		t.Fatal("an ended execution still counted:", reason)
	}
}

func TestOnlyModelsTheNamedQuotas(t *testing.T) {
	m, err := New(Config{Region: "eu-west-1", Scale: 1000, Only: []ID{SFNStandardStart}}, Resources{Tables: testTables}, nil, newClock().now)
	if err != nil {
		t.Fatal(err)
	}
	if !m.bucket(SFNStandardStart, "").Take(1) || m.bucket(SFNStandardStart, "").Take(1) {
		t.Error("StartExecution, named, is not modelled")
	}
	for range 100 {
		if !m.bucket(DynamoPartitionWrite, "state//S:x").Take(1) {
			t.Fatal("a partition write was throttled though only StartExecution is modelled")
		}
	}
}

func TestRegionOfReadsCDKJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cdk.json")
	if err := os.WriteFile(path, []byte(`{"context":{"environments":{"prod":{"region":"eu-west-1"},"local":{}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := RegionOf(path, "prod"); err != nil || r != "eu-west-1" {
		t.Errorf("prod: %q %v", r, err)
	}
	if _, err := RegionOf(path, "local"); err == nil {
		t.Error("an environment without a region gave one")
	}
}
