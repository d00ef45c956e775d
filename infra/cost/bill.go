package cost

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Assumptions are what neither the template nor the benchmark says; each is printed under
// the table it prices.
type Assumptions struct {
	// DurationMS is how long a step's function runs, by step: "api" for the API call, a
	// task's state name for a workflow task. Measured on the local stack where a benchmark
	// measures it (docs/numbers.md); AWS, with network round trips, is slower.
	DurationMS map[string]float64
	// AppLogBytes is what a step's function logs itself (its slog lines) per invocation,
	// PlatformLogBytes what Lambda adds (START, END, REPORT with the X-Ray trace id).
	AppLogBytes      map[string]int
	PlatformLogBytes int
	// A Step Functions log event: its envelope, and the state's data it carries when the
	// log includes execution data (the run's input for one node and its VMs).
	StateLogEnvelope, StateDataBytes int
	// XRaySampled is the share of traces recorded: X-Ray's default rule records the first
	// request each second and 5% of the others.
	XRaySampled float64
	// KeptForGoodMonths prices the storage of items without a TTL (the audit records) for
	// this many months.
	KeptForGoodMonths float64
	// ExpressMemoryMB is the memory an Express execution is billed for (64 MB steps).
	ExpressMemoryMB int
	// ExpressStateMS is the time an Express execution spends in each state it enters beside
	// the function a task runs (the transition, a lambda:invoke's round trip, a Choice): its
	// billed duration is the sum of its tasks' function times and this per state.
	ExpressStateMS float64
	// QueueBatch is how many messages an event source mapping's poll receives, deletes and
	// hands to one invocation of its function, on average: 1 when reclaims come one at a
	// time, up to the mapping's batch size in a burst.
	QueueBatch float64
	// AgentKeyDecrypts is the KMS Decrypts of a node's agent key per reclaim. terminate-node
	// opens a node's KMS-sealed key with KMS once per key generation (its first open after a
	// rotation) and stores it resealed under the agent master secret, which every later open,
	// in any instance, uses instead (shared/agent.Resealer): 0 for a typical reclaim in steady
	// state. (Within the 10 minutes after a rotation the previous generation is opened with
	// KMS too, once per instance: rare, and not a typical reclaim.)
	AgentKeyDecrypts float64
	// Run is what a typical run's data says at the workflow's choices and waits, for each
	// execution of the reclaim in turn: 0 is the one the API call starts, 1 the next one (a
	// queue's consumer starts it when the message comes due), and so on.
	Run func(c Case, execution int) Run
}

// Typical is the typical reclaim: every VM terminated in the first round; the grace waited
// as the case says.
var Typical = Assumptions{
	// api: BenchmarkReclaim's p50 through the gateway, 11.7 ms, billed 12 ms; TerminateNode:
	// BenchmarkTermination, about 10 ms for up to 8 VMs; NotifyAgents without a grace is one
	// Query, with one it calls the agent once per VM (BenchmarkNotice); Notify and Report (a
	// Query and a PutEvents) have no benchmark: 100 ms each; termination-steps (the queue's
	// consumer: one StartExecution per due step) has none either: 30 ms.
	DurationMS:        map[string]float64{"api": 12, "NotifyAgents": 10, "Notify": 100, "TerminateNode": 10, "Report": 100, "termination-steps": 30},
	AppLogBytes:       map[string]int{"api": 900, "NotifyAgents": 300, "Notify": 300, "TerminateNode": 600, "Report": 400, "termination-steps": 300},
	PlatformLogBytes:  450,
	StateLogEnvelope:  350,
	StateDataBytes:    450,
	XRaySampled:       0.05,
	KeptForGoodMonths: 12,
	ExpressMemoryMB:   64,
	ExpressStateMS:    10,
	QueueBatch:        1,
	AgentKeyDecrypts:  0,
	// The step of the Express design (shared/stepfn.Input): the API starts step "first" with
	// the grace left as its delay; the queue brings step "round" when it is due.
	Run: func(c Case, execution int) Run {
		if execution == 0 {
			return Run{"$.step": "first", "$.done": true, "$.delaySeconds": float64(c.GraceSeconds), "$.terminateAfter": float64(c.GraceSeconds)}
		}
		return Run{"$.step": "round", "$.done": true, "$.delaySeconds": 0.0, "$.terminateAfter": 0.0}
	},
}

// Line is one priced item of a reclaim's bill.
type Line struct {
	Service  string // "Step Functions", "DynamoDB", ...
	What     string // "Standard state transitions"
	Quantity string // per reclaim, as text: "6 transitions"
	USD      float64
}

// Bill is a reclaim's lines, in the order of Services.
type Bill struct {
	Case  Case
	Lines []Line
}

// Total is the bill's sum, per reclaim.
func (b Bill) Total() float64 {
	t := 0.0
	for _, l := range b.Lines {
		t += l.USD
	}
	return t
}

// ByService sums the lines of each service.
func (b Bill) ByService() map[string]float64 {
	out := map[string]float64{}
	for _, l := range b.Lines {
		out[l.Service] += l.USD
	}
	return out
}

// Services orders the services in the table.
var Services = []string{"API Gateway", "Lambda", "Step Functions", "SQS", "EventBridge", "DynamoDB", "KMS", "CloudWatch Logs", "X-Ray"}

const gb = 1 << 30
const daysPerMonth = 30.4375

// Price prices one reclaim of the case on the design.
func Price(d Design, u Case, p Prices, a Assumptions) (Bill, error) {
	b := Bill{Case: u}
	add := func(service, what, qty string, usd float64) {
		if usd != 0 || qty != "" {
			b.Lines = append(b.Lines, Line{service, what, qty, usd})
		}
	}
	if len(d.APIs) != 1 || d.APIs[0].Function == "" {
		return b, fmt.Errorf("want one REST API proxying to one function, have %+v", d.APIs)
	}
	api := d.APIs[0]

	// Who runs what: the API call, then every execution it starts, walked; a message a run
	// sends to a queue invokes the queue's consumer, which may start the next execution.
	type invocation struct {
		step, fn string
		n        float64 // invocations per reclaim: a consumer's are shared by a batch
	}
	invocations := []invocation{{"api", api.Function, 1}}
	var transitions, expressRuns, executions int
	var expressGBs float64
	var expressDur []string
	var sfnLogBytes, lambdaLogBytes float64
	var sqsRequests, sqsMessages float64
	var quietLogs []string // machines whose succeeded runs log nothing, for the table
	batch := math.Max(1, a.QueueBatch)
	traces := 0.0
	if api.Tracing || d.Functions[api.Function].Tracing {
		traces++
	}
	logDays := map[string]float64{} // log bytes ingested by retention days, for storage
	entered := map[string]bool{"api": true}

	var runMachine func(name string, depth int) error
	runMachine = func(name string, depth int) error {
		sm, ok := d.StateMachines[name]
		if !ok {
			return fmt.Errorf("state machine %q is not in the template", name)
		}
		if depth > 5 {
			return fmt.Errorf("state machines start each other more than 5 deep (at %s)", name)
		}
		visits, err := Walk(sm.Definition, a.Run(u, executions))
		if err != nil {
			return fmt.Errorf("%s, execution %d: %w", name, executions, err)
		}
		executions++
		// This run's duration line, in the order the runs start (a run the queue's consumer
		// starts is walked inside this one's walk).
		durAt := len(expressDur)
		expressDur = append(expressDur, "")
		events := 2 // ExecutionStarted, ExecutionSucceeded
		seconds := 0.0
		for _, v := range visits {
			entered[v.State] = true
			switch {
			case v.Function != "":
				invocations = append(invocations, invocation{v.State, v.Function, 1})
				events += 5 // StateEntered, Scheduled, Started, Succeeded, StateExited
				ms, ok := a.DurationMS[v.State]
				if !ok {
					return fmt.Errorf("%s: how long task %s runs is not known (Assumptions.DurationMS)", name, v.State)
				}
				seconds += ms / 1000
			case v.Queue != "":
				events += 4
				// The send, then the consumer's receive and delete, each for a batch.
				sqsMessages++
				sqsRequests += 1 + 2/batch
				var consumers []string
				for _, fn := range sortedKeys(d.Functions) {
					if slices.Contains(d.Functions[fn].Queues, v.Queue) {
						consumers = append(consumers, fn)
					}
				}
				if len(consumers) != 1 {
					return fmt.Errorf("%s: state %s sends to queue %q, which %d functions consume: want one", name, v.State, v.Queue, len(consumers))
				}
				fn := consumers[0]
				invocations = append(invocations, invocation{fn, fn, 1 / batch})
				switch next := d.Functions[fn].StateMachines; len(next) {
				case 0:
				case 1:
					// The consumer starts the step's execution when it is due.
					if err := runMachine(next[0], depth+1); err != nil {
						return err
					}
				default:
					return fmt.Errorf("queue %s's consumer %s names state machines %v: which one it starts is not known", v.Queue, fn, next)
				}
			case v.StartsMachine != "":
				events += 4
				if err := runMachine(v.StartsMachine, depth+1); err != nil {
					return err
				}
			default:
				events += 2
				seconds += v.WaitSeconds
			}
		}
		if sm.Type == "EXPRESS" {
			expressRuns++
			seconds += a.ExpressStateMS / 1000 * float64(len(visits))
			mem := math.Ceil(float64(a.ExpressMemoryMB)/64) * 64
			billed := math.Ceil(seconds*10-1e-9) / 10 // per 100 ms started
			expressGBs += billed * mem / 1024
			expressDur[durAt] = fmt.Sprintf("%d states, %.0f ms billed %.0f", len(visits), seconds*1000, billed*1000)
		} else {
			transitions += len(visits)
		}
		if sm.Tracing {
			traces++
		}
		switch sm.LogLevel {
		case "ALL":
			per := float64(a.StateLogEnvelope)
			if sm.LogExecution {
				per += float64(a.StateDataBytes)
			}
			sfnLogBytes += float64(events) * per
			logDays[fmt.Sprint(sm.LogDays)] += float64(events) * per
		case "ERROR", "FATAL":
			// Only a failed state or run is logged: a typical run succeeds.
			if !slices.Contains(quietLogs, name+" "+sm.LogLevel) {
				quietLogs = append(quietLogs, name+" "+sm.LogLevel)
			}
		}
		return nil
	}
	for _, step := range sortedKeys(u.Steps) {
		st := u.Steps[step]
		if st.Starts == 0 {
			continue
		}
		fn := api.Function
		if step != "api" {
			return b, fmt.Errorf("step %s starts executions: which function runs it is not priced yet", step)
		}
		machines := d.Functions[fn].StateMachines
		if len(machines) != 1 {
			return b, fmt.Errorf("function %s starts %d executions and its environment names state machines %v: which one is not known", fn, st.Starts, machines)
		}
		for range st.Starts {
			if err := runMachine(machines[0], 0); err != nil {
				return b, err
			}
		}
	}
	for step := range u.Steps {
		if !entered[step] {
			return b, fmt.Errorf("the benchmark measured step %s, which no run of the template enters", step)
		}
	}

	// API Gateway.
	add("API Gateway", "REST API requests", "1 request", p.APIGatewayREST.USD)

	// Lambda.
	var gbs float64
	var durParts []string
	for _, inv := range invocations {
		f := d.Functions[inv.fn]
		ms, ok := a.DurationMS[inv.step]
		if !ok {
			return b, fmt.Errorf("how long %s runs for step %s is not known (Assumptions.DurationMS)", inv.fn, inv.step)
		}
		g := inv.n * math.Ceil(ms) / 1000 * float64(f.MemoryMB) / 1024
		price := p.LambdaGBsArm.USD
		if f.Arch != "arm64" {
			price = p.LambdaGBsX86.USD
		}
		gbs += g * price / p.LambdaGBsArm.USD
		durParts = append(durParts, fmt.Sprintf("%s %g ms", inv.step, math.Ceil(ms)))
		platform := a.PlatformLogBytes
		if f.NoPlatformLogs {
			platform = 0
		}
		logs := inv.n * float64(platform+a.AppLogBytes[inv.step])
		lambdaLogBytes += logs
		logDays[fmt.Sprint(f.LogDays)] += logs
	}
	calls := 0.0
	for _, inv := range invocations {
		calls += inv.n
	}
	add("Lambda", "requests", plural(calls, "invocation"), calls*p.LambdaRequest.USD)
	add("Lambda", "duration (memory and architecture from the template)", fmt.Sprintf("%s: %.4f GB-s", strings.Join(durParts, ", "), gbs), gbs*p.LambdaGBsArm.USD)

	// Step Functions.
	if transitions > 0 {
		add("Step Functions", "Standard state transitions", plural(float64(transitions), "transition"), float64(transitions)*p.SFNTransition.USD)
	}
	if expressRuns > 0 {
		add("Step Functions", "Express executions", plural(float64(expressRuns), "execution"), float64(expressRuns)*p.SFNExpressReq.USD)
		add("Step Functions", "Express duration (per 100 ms started, 64 MB steps)", fmt.Sprintf("%s: %.4f GB-s", strings.Join(slices.DeleteFunc(expressDur, func(s string) bool { return s == "" }), "; "), expressGBs), expressGBs*p.SFNExpressGBs.USD)
	}
	if sqsRequests > 0 {
		add("SQS", "requests: a step's send, its consumer's receive and delete (per batch)",
			fmt.Sprintf("%s, %g a batch: %s", plural(sqsMessages, "message"), batch, plural(sqsRequests, "request")), sqsRequests*p.SQSRequest.USD)
	}

	// EventBridge, KMS.
	events, keyOpens := 0, 0
	for _, st := range u.Steps {
		events += st.Events
		if st.AgentCalls > 0 || st.AgentNotices > 0 {
			keyOpens++ // the node's agent key opened, once per invocation that calls the agent
		}
	}
	add("EventBridge", "custom events published", plural(float64(events), "event"), float64(events)*p.EventBridgeEvent.USD)

	// DynamoDB.
	dy, err := d.dynamo(u)
	if err != nil {
		return b, err
	}
	var ixParts []string
	for _, k := range sortedKeys(dy.byTable) {
		if strings.Contains(k, "/") && dy.byTable[k] > 0 {
			ixParts = append(ixParts, fmt.Sprintf("%s %g", k, dy.byTable[k]))
		}
	}
	var tParts []string
	for _, k := range sortedKeys(dy.byTable) {
		if !strings.Contains(k, "/") {
			tParts = append(tParts, fmt.Sprintf("%s %g", k, dy.byTable[k]))
		}
	}
	// Each table's units at its class's prices; an index is billed as its table.
	var tableUSD, indexUSD, readUSD float64
	for k, n := range dy.byTable {
		name, ix, _ := strings.Cut(k, "/")
		wru, _, _ := p.dynamo(d.Tables[name])
		if ix != "" {
			indexUSD += n * wru
		} else {
			tableUSD += n * wru
		}
	}
	for name, n := range dy.readsByTable {
		_, rru, _ := p.dynamo(d.Tables[name])
		readUSD += n * rru
	}
	add("DynamoDB", "writes, tables", fmt.Sprintf("%g WRU (%s)", dy.wru, strings.Join(tParts, ", ")), tableUSD)
	add("DynamoDB", "writes, index entries", fmt.Sprintf("%g WRU (%s)", dy.indexWRU, strings.Join(ixParts, ", ")), indexUSD)
	add("DynamoDB", "reads", fmt.Sprintf("%g RRU", dy.rru), readUSD)
	var gbMonths, storageUSD, pitrGBMonths float64
	for _, it := range u.Stored {
		months := a.KeptForGoodMonths
		if it.TTLSeconds > 0 {
			months = float64(it.TTLSeconds) / 86400 / daysPerMonth
		}
		t := d.Tables[it.Table]
		size := float64(sum(it.Attributes) + 100) // DynamoDB adds 100 B an item
		base := size
		for _, ix := range t.Indexes {
			if pr := ix.projected(it.Attributes, tableKeys); pr != nil {
				size += float64(sum(pr) + 100)
			}
		}
		gbMonths += size / gb * months
		_, _, perGBMonth := p.dynamo(t)
		storageUSD += size / gb * months * perGBMonth
		if t.PITR {
			pitrGBMonths += base / gb * months
		}
	}
	add("DynamoDB", "storage of the items it leaves, with their index entries, over their TTL", fmt.Sprintf("%d items, %.2e GB-months", len(u.Stored), gbMonths), storageUSD)
	if pitrGBMonths > 0 {
		add("DynamoDB", "point-in-time recovery of those items", fmt.Sprintf("%.2e GB-months", pitrGBMonths), pitrGBMonths*p.DynamoPITR.USD)
	}

	add("KMS", "Decrypt of the node's agent key: once per key generation, then opened resealed",
		fmt.Sprintf("%s (%s opening it resealed)", plural(a.AgentKeyDecrypts, "request"), plural(float64(keyOpens), "invocation")),
		a.AgentKeyDecrypts*p.KMSRequest.USD)

	// CloudWatch Logs.
	accessBytes := float64(api.AccessLogBytes)
	logDays[fmt.Sprint(api.AccessLogDays)] += accessBytes
	add("CloudWatch Logs", "Lambda logs (vended)", fmt.Sprintf("%.0f B", lambdaLogBytes), lambdaLogBytes/gb*p.LogsVendedIngest.USD)
	if sfnLogBytes > 0 {
		add("CloudWatch Logs", "state machine logs (vended; level and execution data from the template)", fmt.Sprintf("%.0f B", sfnLogBytes), sfnLogBytes/gb*p.LogsVendedIngest.USD)
	} else if len(quietLogs) > 0 {
		add("CloudWatch Logs", "state machine logs (vended; level and execution data from the template)", fmt.Sprintf("0 B (%s: a run that succeeds logs nothing)", strings.Join(quietLogs, ", ")), 0)
	}
	add("CloudWatch Logs", "API access log", fmt.Sprintf("%.0f B", accessBytes), accessBytes/gb*p.LogsIngest.USD)
	var logGBMonths float64
	for days, bytes := range logDays {
		var n float64
		fmt.Sscan(days, &n)
		months := n / daysPerMonth
		if n == 0 {
			months = a.KeptForGoodMonths
		}
		logGBMonths += bytes / gb * months
	}
	add("CloudWatch Logs", "storage over the log groups' retention", fmt.Sprintf("%.2e GB-months", logGBMonths), logGBMonths*p.LogsStorage.USD)

	add("X-Ray", "traces recorded", fmt.Sprintf("%g traces × %g sampled", traces, a.XRaySampled), traces*a.XRaySampled*p.XRayTrace.USD)
	slices.SortStableFunc(b.Lines, func(x, y Line) int {
		return slices.Index(Services, x.Service) - slices.Index(Services, y.Service)
	})
	return b, nil
}

func plural(n float64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%g %ss", math.Round(n*100)/100, what)
}
