package cost

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// template builds a small CloudFormation template: a REST API proxying to "api", which
// starts state machine "wf" of the given type and definition; functions "api" and "work"
// (256 MB arm64); a table "state" with index byState on gsi1pk/gsi1sk; a queue "delays"
// that "work" consumes.
func template(t *testing.T, smType, definition string) []byte {
	t.Helper()
	fn := func(name string, env map[string]any) map[string]any {
		return map[string]any{"Type": "AWS::Lambda::Function", "Properties": map[string]any{
			"FunctionName": "capacity-prod-" + name, "MemorySize": 256.0, "Architectures": []any{"arm64"},
			"Environment": map[string]any{"Variables": env}}}
	}
	parts := strings.Split(definition, "WORK_ARN")
	var join []any
	for i, p := range parts {
		if i > 0 {
			join = append(join, map[string]any{"Fn::GetAtt": []any{"Work", "Arn"}})
		}
		join = append(join, p)
	}
	tp := map[string]any{"Resources": map[string]any{
		"Api":  fn("api", map[string]any{"STATE_MACHINE_ARN": map[string]any{"Ref": "Wf"}}),
		"Work": fn("work", nil),
		"Wf": map[string]any{"Type": "AWS::StepFunctions::StateMachine", "Properties": map[string]any{
			"StateMachineName": "capacity-prod-wf", "StateMachineType": smType,
			"DefinitionString": map[string]any{"Fn::Join": []any{"", join}}}},
		"Rest":  map[string]any{"Type": "AWS::ApiGateway::RestApi", "Properties": map[string]any{}},
		"Stage": map[string]any{"Type": "AWS::ApiGateway::Stage", "Properties": map[string]any{"RestApiId": map[string]any{"Ref": "Rest"}}},
		"Method": map[string]any{"Type": "AWS::ApiGateway::Method", "Properties": map[string]any{
			"RestApiId": map[string]any{"Ref": "Rest"}, "Integration": map[string]any{"Uri": map[string]any{"Fn::Join": []any{"", []any{"arn:", map[string]any{"Fn::GetAtt": []any{"Api", "Arn"}}}}}}}},
		"State": map[string]any{"Type": "AWS::DynamoDB::Table", "Properties": map[string]any{
			"TableName": "capacity-prod-state", "BillingMode": "PAY_PER_REQUEST",
			"GlobalSecondaryIndexes": []any{map[string]any{"IndexName": "byState",
				"KeySchema":  []any{map[string]any{"AttributeName": "gsi1pk"}, map[string]any{"AttributeName": "gsi1sk"}},
				"Projection": map[string]any{"ProjectionType": "ALL"}}}}},
		"Delays": map[string]any{"Type": "AWS::SQS::Queue", "Properties": map[string]any{"QueueName": "capacity-prod-delays"}},
		"Esm": map[string]any{"Type": "AWS::Lambda::EventSourceMapping", "Properties": map[string]any{
			"EventSourceArn": map[string]any{"Fn::GetAtt": []any{"Delays", "Arn"}}, "FunctionName": map[string]any{"Ref": "Work"}}},
	}}
	b, err := json.Marshal(tp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const loop = `{"StartAt":"Work","States":{
 "Work":{"Type":"Task","Resource":"arn:aws:states:::lambda:invoke","Parameters":{"FunctionName":"WORK_ARN"},"Next":"Done?"},
 "Done?":{"Type":"Choice","Choices":[{"Variable":"$.done","BooleanEquals":true,"Next":"End"}],"Default":"Again"},
 "Again":{"Type":"Wait","Seconds":10,"Next":"Work"},
 "End":{"Type":"Succeed"}}}`

const viaQueue = `{"StartAt":"Send","States":{
 "Send":{"Type":"Task","Resource":"arn:aws:states:::sqs:sendMessage","Parameters":{"QueueUrl":"delays"},"End":true}}}`

func testCase(starts int, steps ...string) Case {
	c := Case{Victims: 2, Steps: map[string]Step{"api": {Starts: starts, Writes: []Write{
		// an operation put: 2 WRU in a transaction, and its byState entry 1 WRU
		{Table: "state", Op: "TransactWriteItems put", Transaction: true, After: map[string]int{"pk": 20, "sk": 10, "gsi1pk": 30, "gsi1sk": 30, "body": 400}, Changed: []string{"body", "gsi1pk", "gsi1sk", "pk", "sk"}},
	}}}}
	for _, s := range steps {
		c.Steps[s] = Step{}
	}
	return c
}

func assumptions(run Run) Assumptions {
	a := Typical
	a.DurationMS = map[string]float64{"api": 10, "Work": 100, "work": 50}
	a.Run = func(Case, int) Run { return run }
	return a
}

func line(b Bill, service, what string) float64 {
	for _, l := range b.Lines {
		if l.Service == service && l.What == what {
			return l.USD * 1e6
		}
	}
	return 0
}

func TestPriceFollowsTheTemplate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		smType     string
		definition string
		run        Run
		steps      []string
		service    string
		what       string
		perMillion float64
	}{
		{"standard, one round: Work, Done?, End", "STANDARD", loop, Run{"$.done": true}, []string{"Work"},
			"Step Functions", "Standard state transitions", 3 * 25},
		{"express, one round: an execution", "EXPRESS", loop, Run{"$.done": true}, []string{"Work"},
			"Step Functions", "Express executions", 1},
		{"express, one round: Work's 100 ms and 3 states of 10 ms, billed 200 ms at 64 MB", "EXPRESS", loop, Run{"$.done": true}, []string{"Work"},
			"Step Functions", "Express duration (per 100 ms started, 64 MB steps)", 0.2 * 64.0 / 1024 * 16.67},
		{"lambda: api and Work invoked", "EXPRESS", loop, Run{"$.done": true}, []string{"Work"},
			"Lambda", "requests", 2 * 0.20},
		{"a queue: send, receive, delete", "EXPRESS", viaQueue, Run{}, []string{"Send"},
			"SQS", "requests: a step's send, its consumer's receive and delete (per batch)", 3 * 0.40},
		{"a queue's consumer is invoked", "EXPRESS", viaQueue, Run{}, []string{"Send"},
			"Lambda", "requests", 2 * 0.20},
		{"index entries from the template's indexes", "STANDARD", loop, Run{"$.done": true}, []string{"Work"},
			"DynamoDB", "writes, index entries", 1 * 0.7068},
		{"table writes, transactional", "STANDARD", loop, Run{"$.done": true}, []string{"Work"},
			"DynamoDB", "writes, tables", 2 * 0.7068},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Extract(template(t, tc.smType, tc.definition), "prod")
			if err != nil {
				t.Fatal(err)
			}
			b, err := Price(d, testCase(1, tc.steps...), EUWest1, assumptions(tc.run))
			if err != nil {
				t.Fatal(err)
			}
			if got := line(b, tc.service, tc.what); math.Abs(got-tc.perMillion) > 1e-6 {
				t.Errorf("%s %s = $%g per million, want $%g; lines %+v", tc.service, tc.what, got, tc.perMillion, b.Lines)
			}
		})
	}
}

func TestPriceRefusesWhatItCannotTell(t *testing.T) {
	for _, tc := range []struct {
		name  string
		def   string
		run   Run
		steps []string
		want  string
	}{
		{"a choice on a value the run does not give", loop, Run{}, []string{"Work"}, "does not say what $.done is"},
		{"a measured step no run enters", loop, Run{"$.done": true}, []string{"Work", "Gone"}, "no run of the template enters"},
		{"a loop that never ends", loop, Run{"$.done": false}, []string{"Work"}, "loops"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Extract(template(t, "STANDARD", tc.def), "prod")
			if err != nil {
				t.Fatal(err)
			}
			_, err = Price(d, testCase(1, tc.steps...), EUWest1, assumptions(tc.run))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Price: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestIndexWrites(t *testing.T) {
	ix := Index{Name: "byState", Keys: []string{"gsi1pk", "gsi1sk"}, Projection: "ALL"}
	item := func(state string, body int) map[string]int {
		return map[string]int{"pk": 20, "sk": 10, "gsi1pk": len(state), "gsi1sk": 30, "body": body}
	}
	for _, tc := range []struct {
		name string
		w    Write
		want float64
	}{
		{"not in the index", Write{Before: map[string]int{"pk": 1}, After: map[string]int{"pk": 1, "x": 1}, Changed: []string{"x"}}, 0},
		{"put into it", Write{After: item("OPSTATE#pending", 400), Changed: []string{"pk"}}, 1},
		{"entry rewritten", Write{Before: item("OPSTATE#terminating", 400), After: item("OPSTATE#terminating", 500), Changed: []string{"body"}}, 1},
		{"key moved: delete and put", Write{Before: item("OPSTATE#pending", 400), After: item("OPSTATE#terminating", 400), Changed: []string{"gsi1pk"}}, 2},
		{"large entry moved", Write{Before: item("OPSTATE#pending", 1500), After: item("OPSTATE#terminating", 1500), Changed: []string{"gsi1pk"}}, 4},
		{"nothing changed", Write{Before: item("OPSTATE#pending", 400), After: item("OPSTATE#pending", 400)}, 0},
		{"deleted", Write{Before: item("OPSTATE#pending", 400), Changed: []string{"pk"}}, 1},
	} {
		if got := ix.indexWrites(tc.w, tableKeys); got != tc.want {
			t.Errorf("%s: %g WRU, want %g", tc.name, got, tc.want)
		}
	}
	keysOnly := Index{Name: "k", Keys: []string{"gsi1pk", "gsi1sk"}, Projection: "KEYS_ONLY"}
	if got := keysOnly.indexWrites(Write{Before: item("a", 400), After: item("a", 500), Changed: []string{"body"}}, tableKeys); got != 0 {
		t.Errorf("KEYS_ONLY index, a non-key attribute changed: %g WRU, want 0", got)
	}
}

// A Choice compares timestamps (seconds from the run's start in the run; the context's times
// are the start) and a path with another path.
func TestWalkComparesTimestampsAndPaths(t *testing.T) {
	def := `{"StartAt":"C","States":{
 "C":{"Type":"Choice","Choices":[{"Variable":"$.dueAt","TimestampGreaterThanPath":"$$.State.EnteredTime","Next":"Later"},
   {"Variable":"$.left","NumericLessThanEquals":0,"Next":"Now"}],"Default":"Other"},
 "Later":{"Type":"Succeed"},"Now":{"Type":"Succeed"},"Other":{"Type":"Succeed"}}}`
	for _, tc := range []struct {
		run  Run
		want string
	}{
		{Run{"$.dueAt": 120.0}, "Later"},
		{Run{"$.dueAt": 0.0, "$.left": 0.0}, "Now"},
		{Run{"$.dueAt": -5.0, "$.left": 3.0}, "Other"},
	} {
		v, err := Walk(json.RawMessage(def), tc.run)
		if err != nil {
			t.Fatal(err)
		}
		if got := v[len(v)-1].State; got != tc.want {
			t.Errorf("run %v ends in %s, want %s", tc.run, got, tc.want)
		}
	}
	if _, err := Walk(json.RawMessage(def), Run{"$.dueAt": "2026-01-01T00:00:00Z"}); err == nil || !strings.Contains(err.Error(), "seconds from the run's start") {
		t.Errorf("a timestamp given as text: %v, want an error saying it is priced as seconds", err)
	}
}
