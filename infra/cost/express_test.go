package cost

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// expressDefinition is the termination workflow of the Express design (docs/termination.md,
// issue 27) as infra/termination.go builds it, its tasks' parameters shortened: one machine whose run is a step, "first" (the
// notices, then the first round unless a grace is left, which the queue's per-message delay
// waits out) or "round" (a round, then the report or the next round through the queue).
// {{Arn:X}} and {{Ref:X}} are references to the template's resources.
const expressDefinition = `{"StartAt":"Step?","States":{
 "Step?":{"Type":"Choice","Choices":[{"Variable":"$.step","StringEquals":"round","Next":"TerminateNode"}],"Default":"NotifyAgents"},
 "NotifyAgents":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::lambda:invoke","Parameters":{"FunctionName":"{{Arn:TerminateNodeFn}}","Payload":{"agentNotices":true,"reclaimId.$":"$.reclaimId"}},"ResultPath":null,"Next":"Notify"},
 "Notify":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::lambda:invoke","Parameters":{"FunctionName":"{{Arn:OperationEventsFn}}","Payload":{"phase":"notice","reclaimId.$":"$.reclaimId"}},"ResultPath":null,"Next":"GraceLeft?"},
 "GraceLeft?":{"Type":"Choice","Choices":[{"Variable":"$.delaySeconds","NumericGreaterThan":0,"Next":"ScheduleRound"}],"Default":"TerminateNode"},
 "ScheduleRound":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::sqs:sendMessage","Parameters":{"QueueUrl":"{{Ref:StepsQueue}}","MessageBody":{"step":"round","reclaimId.$":"$.reclaimId"},"DelaySeconds.$":"$.delaySeconds"},"Next":"Scheduled"},
 "Scheduled":{"Type":"Succeed"},
 "TerminateNode":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::lambda:invoke","Parameters":{"FunctionName":"{{Arn:TerminateNodeFn}}","Payload":{"reclaimId.$":"$.reclaimId","round.$":"$.round"}},"OutputPath":"$.Payload","Next":"AllTerminated?"},
 "AllTerminated?":{"Type":"Choice","Choices":[{"Variable":"$.done","BooleanEquals":true,"Next":"Report"}],"Default":"ScheduleRetry"},
 "ScheduleRetry":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::sqs:sendMessage","Parameters":{"QueueUrl":"{{Ref:StepsQueue}}","MessageBody":{"step":"round","reclaimId.$":"$.reclaimId"},"DelaySeconds":10},"Next":"Scheduled"},
 "Report":{"Type":"Task","Resource":"arn:{{Ref:AWS::Partition}}:states:::lambda:invoke","Parameters":{"FunctionName":"{{Arn:OperationEventsFn}}","Payload":{"phase":"report","reclaimId.$":"$.reclaimId"}},"ResultPath":null,"End":true}}}`

var reference = regexp.MustCompile(`\{\{(Ref|Arn):([A-Za-z:]+)\}\}`)

// joined is a definition as CDK writes it: an Fn::Join of its text and its references.
func joined(definition string) map[string]any {
	var parts []any
	last := 0
	for _, m := range reference.FindAllStringSubmatchIndex(definition, -1) {
		parts = append(parts, definition[last:m[0]])
		kind, id := definition[m[2]:m[3]], definition[m[4]:m[5]]
		if kind == "Ref" {
			parts = append(parts, map[string]any{"Ref": id})
		} else {
			parts = append(parts, map[string]any{"Fn::GetAtt": []any{id, "Arn"}})
		}
		last = m[1]
	}
	parts = append(parts, definition[last:])
	return map[string]any{"Fn::Join": []any{"", parts}}
}

// expressTemplate is the part of the prod template the Express design changes: the
// termination machine (EXPRESS, logs at level ERROR with execution data, tracing), the
// functions its tasks invoke, the termination-steps queue and its consumer, which may start
// the machine.
func expressTemplate(t *testing.T) []byte {
	t.Helper()
	fn := func(name string, memory float64, env map[string]any) map[string]any {
		return map[string]any{"Type": "AWS::Lambda::Function", "Properties": map[string]any{
			"FunctionName": "capacity-prod-" + name, "MemorySize": memory, "Architectures": []any{"arm64"},
			"TracingConfig": map[string]any{"Mode": "Active"},
			"LoggingConfig": map[string]any{"LogGroup": map[string]any{"Ref": "FnLogs"}, "LogFormat": "JSON", "SystemLogLevel": "WARN", "ApplicationLogLevel": "INFO"},
			"Environment":   map[string]any{"Variables": env}}}
	}
	startsTermination := map[string]any{"TERMINATION_STATE_MACHINE_ARN": map[string]any{"Ref": "Termination"}}
	tp := map[string]any{"Resources": map[string]any{
		"ApiFn":             fn("api", 256, startsTermination),
		"TerminateNodeFn":   fn("terminate-node", 256, nil),
		"OperationEventsFn": fn("operation-events", 256, nil),
		"StepsFn":           fn("termination-steps", 128, startsTermination),
		"FnLogs":            map[string]any{"Type": "AWS::Logs::LogGroup", "Properties": map[string]any{"RetentionInDays": 90.0}},
		"MachineLogs":       map[string]any{"Type": "AWS::Logs::LogGroup", "Properties": map[string]any{"RetentionInDays": 90.0}},
		"Termination": map[string]any{"Type": "AWS::StepFunctions::StateMachine", "Properties": map[string]any{
			"StateMachineName": "capacity-prod-termination-express", "StateMachineType": "EXPRESS",
			"DefinitionString": joined(expressDefinition),
			"LoggingConfiguration": map[string]any{"Level": "ERROR", "IncludeExecutionData": true,
				"Destinations": []any{map[string]any{"CloudWatchLogsLogGroup": map[string]any{"LogGroupArn": map[string]any{"Fn::GetAtt": []any{"MachineLogs", "Arn"}}}}}},
			"TracingConfiguration": map[string]any{"Enabled": true}}},
		"StepsQueue":    map[string]any{"Type": "AWS::SQS::Queue", "Properties": map[string]any{"QueueName": "capacity-prod-termination-steps"}},
		"StepsQueueDLQ": map[string]any{"Type": "AWS::SQS::Queue", "Properties": map[string]any{"QueueName": "capacity-prod-termination-steps-dlq"}},
		"StepsMapping": map[string]any{"Type": "AWS::Lambda::EventSourceMapping", "Properties": map[string]any{
			"EventSourceArn": map[string]any{"Fn::GetAtt": []any{"StepsQueue", "Arn"}}, "FunctionName": map[string]any{"Ref": "StepsFn"}, "BatchSize": 10.0}},
	}}
	b, err := json.Marshal(tp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kept is the design docs/cost/before.json keeps (the prod template's before the Express
// switch) with the table classes the stack has since given its tables (infra/tables.go: the
// audit table in Standard-IA, its byReservation index keys only), its functions' system log level since (WARN), and the units of today's reclaims (docs/cost/units.json).
func kept(t *testing.T) (Design, Units) {
	t.Helper()
	b, err := os.ReadFile("../../docs/cost/before.json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Design Design `json:"design"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	s.Design.Tables = maps.Clone(s.Design.Tables)
	audit := s.Design.Tables["audit"]
	audit.Class = "STANDARD_INFREQUENT_ACCESS"
	audit.Indexes = slices.Clone(audit.Indexes)
	for i := range audit.Indexes {
		audit.Indexes[i].Projection = "KEYS_ONLY" // byReservation (shared/table)
	}
	s.Design.Tables["audit"] = audit
	// Every function's system log level is WARN (infra/functions.go): no START/END/REPORT.
	s.Design.Functions = maps.Clone(s.Design.Functions)
	for name, f := range s.Design.Functions {
		f.NoPlatformLogs = true
		s.Design.Functions[name] = f
	}
	ub, err := os.ReadFile("../../docs/cost/units.json")
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUnits(ub)
	if err != nil {
		t.Fatal(err)
	}
	return s.Design, u
}

// withExpress is the kept design with the Express fragment's machine, functions and queues
// in place of its own: the prod template as it will be once the switch lands.
func withExpress(t *testing.T, d Design) Design {
	t.Helper()
	frag, err := Extract(expressTemplate(t), "prod")
	if err != nil {
		t.Fatal(err)
	}
	out := d
	out.StateMachines = map[string]StateMachine{}
	for k, v := range d.StateMachines {
		out.StateMachines[k] = v
	}
	out.Functions = map[string]Function{}
	for k, v := range d.Functions {
		out.Functions[k] = v
	}
	out.Queues = map[string]Queue{}
	for k, v := range d.Queues {
		out.Queues[k] = v
	}
	for k, v := range frag.StateMachines {
		out.StateMachines[k] = v
	}
	for k, v := range frag.Functions {
		out.Functions[k] = v
	}
	for k, v := range frag.Queues {
		out.Queues[k] = v
	}
	return out
}

func lineQty(b Bill, service, what string) string {
	for _, l := range b.Lines {
		if l.Service == service && strings.HasPrefix(l.What, what) {
			return l.Quantity
		}
	}
	return ""
}

// The Express design, priced with the units the benchmark measured: at grace 0 one run
// through every task; at grace 120 s a first run that queues the round, the queue's
// consumer, and a second run for the round and the report. Step Functions falls from
// Standard's 6 transitions ($150 a million) to executions and their duration, and a run
// that succeeds logs nothing.
func TestPriceOfTheExpressDesign(t *testing.T) {
	before, units := kept(t)
	d := withExpress(t, before)
	for _, tc := range []struct {
		caseKey     string
		executions  string
		invocations string
		sqs         string
		sfnAtMost   float64 // $ per million
	}{
		{"grace-0", "1 execution", "5 invocations", "", 1.5},
		{"grace-120", "2 executions", "6 invocations", "1 message, 1 a batch: 3 requests", 3},
	} {
		t.Run(tc.caseKey, func(t *testing.T) {
			b, err := Price(d, units.Cases[tc.caseKey], EUWest1, Typical)
			if err != nil {
				t.Fatal(err)
			}
			was, err := Price(before, units.Cases[tc.caseKey], EUWest1, Typical)
			if err != nil {
				t.Fatal(err)
			}
			if got := lineQty(b, "Step Functions", "Express executions"); got != tc.executions {
				t.Errorf("Express executions %q, want %q", got, tc.executions)
			}
			if got := lineQty(b, "Lambda", "requests"); got != tc.invocations {
				t.Errorf("Lambda %q, want %q", got, tc.invocations)
			}
			if got := lineQty(b, "SQS", "requests"); got != tc.sqs {
				t.Errorf("SQS %q, want %q", got, tc.sqs)
			}
			by := b.ByService()
			if got := by["Step Functions"] * 1e6; got > tc.sfnAtMost {
				t.Errorf("Step Functions $%.2f per million, want at most $%g", got, tc.sfnAtMost)
			}
			if got := line(b, "CloudWatch Logs", "state machine logs (vended; level and execution data from the template)"); got != 0 {
				t.Errorf("state machine logs $%g per million, want none at level ERROR", got)
			}
			if by["DynamoDB"] != was.ByService()["DynamoDB"] {
				t.Errorf("DynamoDB $%g, want the kept design's $%g: the workflow's engine writes no table", by["DynamoDB"]*1e6, was.ByService()["DynamoDB"]*1e6)
			}
			var parts []string
			for _, s := range Services {
				if v, ok := by[s]; ok {
					parts = append(parts, s+" $"+strings.TrimRight(strings.TrimRight(fmtMoney(v), "0"), "."))
				}
			}
			t.Logf("Express design, %s: $%.2f per million (kept Standard design $%.2f): %s", tc.caseKey, b.Total()*1e6, was.Total()*1e6, strings.Join(parts, ", "))
		})
	}
}

func fmtMoney(usd float64) string { return strings.TrimPrefix(money(usd), "$") }

// A batch of the queue's messages is received, deleted and handed over in one call each.
func TestQueueBatchSharesReceiveDeleteAndInvocation(t *testing.T) {
	before, units := kept(t)
	d := withExpress(t, before)
	a := Typical
	a.QueueBatch = 10
	b, err := Price(d, units.Cases["grace-120"], EUWest1, a)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := line(b, "SQS", "requests: a step's send, its consumer's receive and delete (per batch)"), 1.2*0.40; math.Abs(got-want) > 1e-9 {
		t.Errorf("SQS $%g per million, want $%g (a send, a tenth of a receive and of a delete)", got, want)
	}
	if got := lineQty(b, "Lambda", "requests"); got != "5.1 invocations" {
		t.Errorf("Lambda %q, want 5.1 invocations (termination-steps once a batch of 10)", got)
	}
}

// A function whose system log level is WARN or above logs none of Lambda's own lines: the
// logs are the functions' own lines alone.
func TestPlatformLogLinesFollowTheSystemLogLevel(t *testing.T) {
	frag, err := Extract(expressTemplate(t), "prod")
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range frag.Functions {
		if !f.NoPlatformLogs {
			t.Errorf("%s: SystemLogLevel WARN read as Lambda's lines logged", name)
		}
	}
	before, units := kept(t)
	d := withExpress(t, before)
	for _, quiet := range []bool{true, false} {
		for name, f := range d.Functions {
			f.NoPlatformLogs = quiet
			d.Functions[name] = f
		}
		b, err := Price(d, units.Cases["grace-0"], EUWest1, Typical)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, step := range []string{"api", "NotifyAgents", "Notify", "TerminateNode", "Report"} {
			want += Typical.AppLogBytes[step]
			if !quiet {
				want += Typical.PlatformLogBytes
			}
		}
		if got := lineQty(b, "CloudWatch Logs", "Lambda logs"); got != fmt.Sprintf("%d B", want) {
			t.Errorf("no platform lines %v: Lambda logs %q, want %d B", quiet, got, want)
		}
	}
}
