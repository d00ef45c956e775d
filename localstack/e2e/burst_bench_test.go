package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/openrelay/capacity/localstack/quota"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
)

// BenchmarkBurst's sizes (shortBenchmarks shrinks them; BURST_N overrides burstN).
var (
	burstN     = 200               // reclaims per shape, each on a node of its own (see docs/scale.md)
	burstGrace = 120 * time.Second // the grace shape's grace (the API's longest)
	burstWide  = 10                // in the mix, every burstWide-th node holds 64 VMs
)

const (
	burstMaxAttempts = 20 // per reclaim: a 429 or 503 is retried after its Retry-After
	// burstGatewayBackoff is the first wait after API Gateway's own 429, which carries no
	// Retry-After: doubled each time up to burstGatewayBackoffMax, jittered, as AWS's SDKs do.
	burstGatewayBackoff    = time.Second
	burstGatewayBackoffMax = 16 * time.Second
)

// burstConfig is what the environment sets for BenchmarkBurst.
//
//   - BURST_N: reclaims per shape (default burstN). When unset and the stack runs under the
//     quota model, the burst of 10,000 reclaims divided by the scale.
//   - BURST_QUOTA_SCALE: the scale factor of the local stack's AWS quota model, which
//     divides every quota's rate and bucket. On the local stack it is CAPACITY_QUOTA_SCALE:
//     TestMain sets that one from it (burstQuotaEnv), so the figures are named by the scale
//     the stack runs at, and a run under quotas is told apart from one without. Against a
//     running stack (CAPACITY_OUTPUTS) it only names the figures.
//   - BURST_WINDOW: the window the arrivals are spread evenly over (default 1s; the issue's
//     10,000 reclaims within 10 s is BURST_WINDOW=10s).
//   - BURST_RECONCILE_EVERY: how often the reconciler runs during the burst (default 1m, its
//     schedule on AWS; schedules never fire on the emulator, so the benchmark invokes it).
//   - BURST_DRAIN_WITHIN: how long the backlog may take to drain before the run fails
//     (default 15m).
type burstConfig struct {
	n              int
	quotaScale     float64
	quotaOnly      []quota.ID // CAPACITY_QUOTA_ONLY: the quotas modelled, if not all
	window         time.Duration
	reconcileEvery time.Duration
	drainWithin    time.Duration
}

func readBurstConfig(b *testing.B) burstConfig {
	c := burstConfig{n: burstN, window: time.Second, reconcileEvery: time.Minute, drainWithin: 15 * time.Minute}
	if localStack != nil { // the scale this process started the stack at (TestMain)
		if stackQuotas != nil {
			c.quotaScale, c.quotaOnly = stackQuotas.Scale, stackQuotas.Only
		}
	} else if v := os.Getenv("BURST_QUOTA_SCALE"); v != "" {
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || s < 0 {
			b.Fatalf("BURST_QUOTA_SCALE=%q: want a scale factor (0: no quota model)", v)
		}
		c.quotaScale = s
	}
	if c.quotaScale > 0 && !testing.Short() {
		c.n = max(1, int(10000/c.quotaScale))
	}
	if v := os.Getenv("BURST_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BURST_N=%q: want a positive number", v)
		}
		c.n = n
	}
	for name, d := range map[string]*time.Duration{"BURST_WINDOW": &c.window, "BURST_RECONCILE_EVERY": &c.reconcileEvery, "BURST_DRAIN_WITHIN": &c.drainWithin} {
		if v := os.Getenv(name); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				b.Fatalf("%s=%q: want a positive duration", name, v)
			}
			*d = p
		}
	}
	return c
}

// burstQuotaEnv makes the stack this process starts run at BURST_QUOTA_SCALE: it sets
// CAPACITY_QUOTA_SCALE from it, or refuses a CAPACITY_QUOTA_SCALE that differs (the figures
// would be named by a scale the stack does not run at). Against a running stack
// (CAPACITY_OUTPUTS) BURST_QUOTA_SCALE only names the figures.
func burstQuotaEnv() error {
	v := os.Getenv("BURST_QUOTA_SCALE")
	if v == "" || os.Getenv("CAPACITY_OUTPUTS") != "" {
		return nil
	}
	want, err := strconv.ParseFloat(v, 64)
	if err != nil || want < 0 {
		return fmt.Errorf("BURST_QUOTA_SCALE=%q: want a scale factor (0: no quota model)", v)
	}
	cur := os.Getenv(quota.EnvScale)
	if cur == "" {
		if want > 0 {
			return os.Setenv(quota.EnvScale, v)
		}
		return nil
	}
	if got, err := strconv.ParseFloat(cur, 64); err == nil && got != want {
		return fmt.Errorf("BURST_QUOTA_SCALE=%s but %s=%s: set one, or both the same", v, quota.EnvScale, cur)
	}
	return nil // an unreadable CAPACITY_QUOTA_SCALE is quota.FromEnv's to report
}

func (c burstConfig) quotaName() string {
	if c.quotaScale == 0 {
		return "off"
	}
	name := strconv.FormatFloat(c.quotaScale, 'g', -1, 64)
	if len(c.quotaOnly) > 0 {
		name += "(only)" // some quotas: told apart from a run under all of them
	}
	return name
}

// burstShape is one kind of burst: the grace of its reclaims and how many spot VMs (each on
// a unit of its own, all reclaimed) node i holds.
type burstShape struct {
	name  string
	grace time.Duration
	vms   func(i int) int
}

func burstShapes() []burstShape {
	two := func(int) int { return 2 }
	return []burstShape{
		{"typical", 0, two},
		{"grace", burstGrace, two},
		{"mix", 0, func(i int) int {
			if i%burstWide == 0 {
				return 64
			}
			return 2
		}},
	}
}

// BenchmarkBurst sends N reclaims over N nodes, their arrivals spread evenly over a window
// (BURST_WINDOW, 1 s), through API Gateway on the local stack, with the owner's key, and
// follows them to the last VM terminated. Three shapes, in one stack, in this order: typical
// (2 spot VMs a node, grace 0), the same with a grace of 120 s, and a mix where every tenth
// node holds 64 VMs. A client retries a 429 or 503 after its Retry-After (with an
// Idempotency-Key, as a client should), and API Gateway's own 429, which has none, after a
// jittered exponential backoff; the reconciler runs on its schedule (BURST_RECONCILE_EVERY).
// It reports:
//
//   - the answers by status; each must be 200, or 429/503 with Retry-After (API Gateway's
//     throttle: without), or the run fails;
//   - the time from the burst's start to the last VM terminated on its agent, and how late
//     the terminations came past their grace (the operation's terminateAfter: commit time
//     plus the grace);
//   - victims never terminated (lost) and victims that got more than one terminate call on
//     their agent (double); either fails the run;
//   - the backlog, the burst's operations still pending-start (read from the table) when the
//     last answer came, and the time until none was;
//   - under the quota model, what each quota throttled or delayed during the shape.
//
// The nodes are seeded straight into the table (not timed), as the other scale benchmarks
// do. The emulator's Query walks the whole table, so later shapes run on a larger table
// (AWS seeks the partition).
func BenchmarkBurst(b *testing.B) {
	cfg := readBurstConfig(b)
	for _, sh := range burstShapes() {
		b.Run(fmt.Sprintf("%s/n=%d/window=%s/grace=%s/quota=%s", sh.name, cfg.n, cfg.window, sh.grace, cfg.quotaName()), func(b *testing.B) {
			for b.Loop() {
				r := runBurst(b, cfg, sh)
				r.report(b)
				fmt.Printf("burst %s: %s\n", b.Name(), r)
				r.check(b)
			}
			b.ReportMetric(0, "ns/op") // includes seeding and the grace; the metrics are the figures
		})
	}
}

// burstAnswer is what one reclaim of the burst got, over its attempts.
type burstAnswer struct {
	sent, answered time.Time
	statuses       []int // one per attempt; 0: no answer (a transport error)
	noRetryAfter   int   // 429 or 503 answers without Retry-After, but API Gateway's throttle's
	gateway429     int   // API Gateway's own throttle: 429 Too Many Requests, no Retry-After
	reclaimID      string
	terminated     []string
	err            string // the last transport error or unexpected answer
}

// burstResult is one burst's figures.
type burstResult struct {
	cfg                  burstConfig
	shape                burstShape
	nodes, victims       int
	seeding              time.Duration
	byStatus             map[int]int // every answer of every attempt
	transport            int         // attempts with no answer
	noRetryAfter         int
	gateway429           int
	retries              int
	badAnswers           []string
	sendSpread           time.Duration
	answerP50, answerP99 time.Duration
	lastAnswer           time.Duration // from the burst's start
	lastTerminated       time.Duration // from the burst's start
	pastGraceP50         time.Duration
	pastGraceMax         time.Duration
	lost, double         int
	hiddenCommits        int // reclaims not answered 200 that committed all the same
	failedOps            int
	backlog              int
	drain                time.Duration // from the last answer to no backlog
	drained              bool
	reconcilerRuns       int
	quota                map[quota.ID]quota.Stats // what the quota model did during the shape
}

func runBurst(b *testing.B, cfg burstConfig, sh burstShape) *burstResult {
	ctx := context.Background()
	r := &burstResult{cfg: cfg, shape: sh, nodes: cfg.n, byStatus: map[int]int{}}

	seedStart := time.Now()
	nodes := make([]string, cfg.n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < cfg.n && !b.Failed(); i = int(next.Add(1)) - 1 {
				nodes[i] = newNode(b, spotNode(sh.vms(i)))
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	for i := range nodes {
		r.victims += sh.vms(i)
	}
	r.seeding = time.Since(seedStart)

	var model *quota.Model
	if localStack != nil {
		model = localStack.Quotas()
	}
	var quotaBefore map[quota.ID]quota.Stats
	if model != nil {
		quotaBefore = model.Stats()
	}

	stopReconciler := reconcileEvery(cfg.reconcileEvery)
	defer func() { r.reconcilerRuns = stopReconciler() }()

	// The burst: reclaim i arrives at start + i*window/N.
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	answers := make([]burstAnswer, cfg.n)
	start := time.Now().Add(50 * time.Millisecond)
	for i, node := range nodes {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(time.Duration(i) * cfg.window / time.Duration(cfg.n))))
			answers[i] = burstReclaim(client, node, sh.vms(i), sh.grace)
		})
	}
	wg.Wait()

	var latencies []time.Duration
	var firstSent, lastSent, lastAnswer time.Time
	for i, a := range answers {
		for _, s := range a.statuses {
			if s == 0 {
				r.transport++
			} else {
				r.byStatus[s]++
			}
		}
		r.retries += len(a.statuses) - 1
		r.noRetryAfter += a.noRetryAfter
		r.gateway429 += a.gateway429
		if want := victimIDs(sh.vms(i)); a.reclaimID == "" || !slices.Equal(sorted(a.terminated), sorted(want)) {
			r.badAnswers = append(r.badAnswers, fmt.Sprintf("%s: %s", nodes[i], a.err))
		}
		latencies = append(latencies, a.answered.Sub(a.sent))
		if firstSent.IsZero() || a.sent.Before(firstSent) {
			firstSent = a.sent
		}
		lastSent = later(lastSent, a.sent)
		lastAnswer = later(lastAnswer, a.answered)
	}
	r.sendSpread = lastSent.Sub(firstSent)
	r.answerP50, r.answerP99 = percentile(latencies, 50), percentile(latencies, 99)
	r.lastAnswer = lastAnswer.Sub(start)

	ops := map[string]string{} // reclaim id -> node
	var victims []victim       // of the reclaims answered 200: committed
	var unanswered []string    // nodes whose reclaim got no 200
	for i, a := range answers {
		if a.reclaimID != "" {
			ops[a.reclaimID] = nodes[i]
			victims = append(victims, victimsOf(nodes[i:i+1], sh.vms(i))...)
		} else {
			unanswered = append(unanswered, nodes[i])
		}
	}

	// The backlog: operations the API committed that are still pending-start, read from the
	// table (an Express run cannot be described).
	r.backlog = pendingStart(ctx, b, ops)
	drainDeadline := time.Now().Add(cfg.drainWithin)
	for left := r.backlog; ; left = pendingStart(ctx, b, ops) {
		if left == 0 {
			r.drained = true
			if r.backlog > 0 {
				r.drain = time.Since(lastAnswer)
			}
			break
		}
		if time.Now().After(drainDeadline) {
			break
		}
		time.Sleep(time.Second)
	}

	// Every victim terminated, then every operation ended, so that a late duplicate call
	// would be counted.
	deadline := time.Now().Add(sh.grace + 5*time.Minute)
	for !allTerminated(victims) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ended := awaitBurstOps(ctx, b, ops, time.Now().Add(2*time.Minute))
	for _, node := range unanswered { // by now, a reclaim that committed late would show
		if committed(b, node) {
			r.hiddenCommits++
		}
	}

	if model != nil {
		r.quota = quotaSince(quotaBefore, model.Stats())
	}

	terminateAfter := map[string]time.Time{} // by node: one operation per node
	for _, op := range ended {
		terminateAfter[op.NodeID] = op.TerminateAfter
		if op.State != capacity.OpCompleted {
			r.failedOps++
		}
	}
	r.failedOps += len(ops) - len(ended)
	var pastGrace []time.Duration
	var lastTerminated time.Time
	for _, v := range victims {
		calls := agents.TerminateCalls(v.node, v.vm)
		switch {
		case agents.Terminations(v.node, v.vm) == 0:
			r.lost++
			continue
		case calls > 1:
			r.double++
		}
		at := agents.TerminatedAt(v.node, v.vm)
		lastTerminated = later(lastTerminated, at)
		if after := terminateAfter[v.node]; !after.IsZero() {
			pastGrace = append(pastGrace, at.Sub(after))
		}
	}
	if !lastTerminated.IsZero() {
		r.lastTerminated = lastTerminated.Sub(start)
	}
	r.pastGraceP50, r.pastGraceMax = percentile(pastGrace, 50), percentile(pastGrace, 100)
	return r
}

// burstReclaim reclaims the node's n units with the grace, retrying a 429 or 503 after its
// Retry-After and a lost answer after a second, under one Idempotency-Key.
func burstReclaim(client *http.Client, node string, n int, grace time.Duration) burstAnswer {
	body := fmt.Sprintf(`{"unitIds":[%s],"graceSeconds":%d,"reason":"burst"}`, quoted(unitIDs(n)), int(grace/time.Second))
	a := burstAnswer{sent: time.Now()}
	gatewayWait := burstGatewayBackoff
	for range burstMaxAttempts {
		req, err := http.NewRequest(http.MethodPost, strings.TrimSuffix(apiURL, "/")+reclaimPath(node), strings.NewReader(body))
		if err != nil {
			a.err = err.Error()
			break
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+keyOwner)
		req.Header.Set("Idempotency-Key", "burst-"+node)
		resp, err := client.Do(req)
		if err != nil {
			a.statuses = append(a.statuses, 0)
			a.err = err.Error()
			time.Sleep(time.Second)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.statuses = append(a.statuses, resp.StatusCode)
		switch resp.StatusCode {
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" &&
				resp.Header.Get("X-Amzn-Errortype") == "TooManyRequestsException" {
				// API Gateway's throttle, before the function: AWS gives no Retry-After there.
				a.gateway429++
				a.err = fmt.Sprintf("%d %s", resp.StatusCode, raw)
				time.Sleep(gatewayWait/2 + rand.N(gatewayWait/2))
				gatewayWait = min(2*gatewayWait, burstGatewayBackoffMax)
				continue
			}
			wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || wait < 0 {
				a.noRetryAfter++
				wait = 1
			}
			a.err = fmt.Sprintf("%d %s", resp.StatusCode, raw)
			time.Sleep(time.Duration(wait) * time.Second)
			continue
		case http.StatusOK:
			a.answered = time.Now()
			var out struct {
				ReclaimID  string   `json:"reclaimId"`
				Terminated []string `json:"terminated"`
			}
			if err := json.Unmarshal(raw, &out); err != nil {
				a.err = fmt.Sprintf("200 with a body that is no answer: %v", err)
				return a
			}
			a.reclaimID, a.terminated = out.ReclaimID, out.Terminated
			a.err = "terminated " + strings.Join(out.Terminated, ",")
			return a
		default:
			a.answered = time.Now()
			a.err = fmt.Sprintf("%d %s", resp.StatusCode, raw)
			return a
		}
	}
	a.answered = time.Now()
	a.err = "no 200 after retries: " + a.err
	return a
}

// pendingStart counts the burst's operations still pending-start: committed, their
// termination not begun. Under a grace period that includes those whose run waits out the
// grace (the run begins the operation after it), as well as those no run was started for.
func pendingStart(ctx context.Context, b *testing.B, ops map[string]string) int {
	n := 0
	for _, op := range operationsIn(ctx, b, capacity.OpPendingStart) {
		if _, ok := ops[op.ID]; ok {
			n++
		}
	}
	return n
}

// quotaSince is what the quota model did between two of its Stats.
func quotaSince(before, after map[quota.ID]quota.Stats) map[quota.ID]quota.Stats {
	d := map[quota.ID]quota.Stats{}
	for id, a := range after {
		s := quota.Stats{Throttled: a.Throttled - before[id].Throttled, Delayed: a.Delayed - before[id].Delayed,
			DelayedBy: a.DelayedBy - before[id].DelayedBy}
		if s != (quota.Stats{}) {
			d[id] = s
		}
	}
	return d
}

// awaitBurstOps waits until every operation of the burst has ended, and returns the ended
// ones (those not ended by the deadline are missing).
func awaitBurstOps(ctx context.Context, b *testing.B, ops map[string]string, deadline time.Time) []capacity.Operation {
	// Read by key: a completed operation leaves the byState index.
	ended := map[string]capacity.Operation{}
	for {
		for id, node := range ops {
			if _, ok := ended[id]; ok {
				continue
			}
			op, err := store.GetOperation(ctx, node, id)
			if err != nil {
				b.Fatalf("operation %s of node %s: %v", id, node, err)
			}
			if op != nil && (op.State == capacity.OpCompleted || op.State == capacity.OpFailed) {
				ended[id] = *op
			}
		}
		if len(ended) == len(ops) || time.Now().After(deadline) {
			return slices.Collect(maps.Values(ended))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// reconcileEvery invokes the reconciler function every period, the first one period from
// now, as its schedule does on AWS (schedules never fire on the emulator), until stop; stop
// returns how many runs there were.
func reconcileEvery(period time.Duration) (stop func() int) {
	lc := lambda.NewFromConfig(stack.AWSConfig(endpoint))
	ctx, cancel := context.WithCancel(context.Background())
	var runs int
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// A failed run is followed by the next, as the schedule's would be.
			_, _ = lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(outputs["ReconcilerFunctionName"]), Payload: []byte(`{}`)})
			runs++
		}
	}()
	return func() int {
		cancel()
		<-done
		return runs
	}
}

// committed says whether a reclaim of the node committed: a seeded node's VMs are all
// running until one does.
func committed(b *testing.B, node string) bool {
	vms := loadNode(b, node).VMs
	for _, vm := range vms {
		if vm.State != capacity.VMRunning {
			return true
		}
	}
	return len(vms) == 0 // terminated VMs leave the node's live state
}

func allTerminated(victims []victim) bool {
	for _, v := range victims {
		if agents.Terminations(v.node, v.vm) == 0 {
			return false
		}
	}
	return true
}

// victimIDs are the VMs spotNode(n) seeds: vm-0..vm-<n-1>.
func victimIDs(n int) []string { return numbered("vm", n) }

func quoted(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ",")
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (r *burstResult) report(b *testing.B) {
	var ok, other int
	for s, n := range r.byStatus {
		switch {
		case s >= 200 && s < 300:
			ok += n
		case s != http.StatusTooManyRequests && s != http.StatusServiceUnavailable:
			other += n
		}
	}
	b.ReportMetric(float64(r.nodes), "reclaims")
	b.ReportMetric(float64(r.victims), "victims")
	b.ReportMetric(r.cfg.quotaScale, "quota-scale")
	b.ReportMetric(float64(ok), "answers-2xx")
	b.ReportMetric(float64(r.byStatus[http.StatusTooManyRequests]), "answers-429")
	b.ReportMetric(float64(r.gateway429), "answers-429-gateway")
	b.ReportMetric(float64(r.byStatus[http.StatusServiceUnavailable]), "answers-503")
	b.ReportMetric(float64(other+r.transport), "answers-other")
	b.ReportMetric(ms(r.sendSpread), "ms-send-spread")
	b.ReportMetric(ms(r.answerP50), "ms-answer-p50")
	b.ReportMetric(ms(r.answerP99), "ms-answer-p99")
	b.ReportMetric(ms(r.lastAnswer), "ms-start-to-last-answer")
	b.ReportMetric(ms(r.lastTerminated), "ms-start-to-last-terminated")
	b.ReportMetric(ms(r.pastGraceP50), "ms-past-grace-p50")
	b.ReportMetric(ms(r.pastGraceMax), "ms-past-grace-max")
	b.ReportMetric(float64(r.lost), "lost")
	b.ReportMetric(float64(r.double), "double")
	b.ReportMetric(float64(r.hiddenCommits), "hidden-commits")
	b.ReportMetric(float64(r.backlog), "backlog")
	b.ReportMetric(ms(r.drain), "ms-backlog-drain")
	for id, st := range r.quota {
		b.ReportMetric(float64(st.Throttled), "throttled-"+string(id))
		b.ReportMetric(float64(st.Delayed), "delayed-"+string(id))
		b.ReportMetric(ms(st.DelayedBy), "ms-delayed-"+string(id))
	}
}

// quotaString says what the quota model did during the shape, per quota.
func (r *burstResult) quotaString() string {
	if r.quota == nil {
		return "no quota model"
	}
	var only string
	if len(r.cfg.quotaOnly) > 0 {
		only = fmt.Sprintf(" (modelling only %s)", strings.Join(slices.Sorted(slices.Values(idStrings(r.cfg.quotaOnly))), ","))
	}
	if len(r.quota) == 0 {
		return "no quota throttled" + only
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(r.quota)) {
		st := r.quota[id]
		p := fmt.Sprintf("%s throttled %d", id, st.Throttled)
		if st.Delayed > 0 {
			p += fmt.Sprintf(" delayed %d (%s in all)", st.Delayed, d(st.DelayedBy))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ") + only
}

func idStrings(ids []quota.ID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = string(id)
	}
	return s
}

// String is the printed summary.
func (r *burstResult) String() string {
	statuses := slices.Sorted(maps.Keys(r.byStatus))
	var parts []string
	for _, s := range statuses {
		parts = append(parts, fmt.Sprintf("%d=%d", s, r.byStatus[s]))
	}
	if r.gateway429 > 0 {
		parts = append(parts, fmt.Sprintf("(of the 429s, API Gateway's throttle %d)", r.gateway429))
	}
	if r.transport > 0 {
		parts = append(parts, fmt.Sprintf("no-answer=%d", r.transport))
	}
	drain := "none left"
	if r.backlog > 0 {
		drain = fmt.Sprintf("drained in %s", r.drain.Round(time.Millisecond))
		if !r.drained {
			drain = fmt.Sprintf("NOT drained within %s", r.cfg.drainWithin)
		}
	}
	return fmt.Sprintf("%d reclaims over %d nodes within %s, %d victims, grace %s, quota scale %s; "+
		"answers %s (%d retries), sent over %s, answer p50 %s p99 %s, last %s after the start; "+
		"last VM terminated %s after the start, past its grace p50 %s max %s; lost %d, double %d, operations not completed %d, commits behind a non-200 answer %d; "+
		"backlog %d pending-start at the last answer, %s (reconciler every %s, %d runs); quotas: %s; seeded in %s",
		r.nodes, r.nodes, r.cfg.window, r.victims, r.shape.grace, r.cfg.quotaName(),
		strings.Join(parts, " "), r.retries, d(r.sendSpread), d(r.answerP50), d(r.answerP99), d(r.lastAnswer),
		d(r.lastTerminated), d(r.pastGraceP50), d(r.pastGraceMax), r.lost, r.double, r.failedOps, r.hiddenCommits,
		r.backlog, drain, r.cfg.reconcileEvery, r.reconcilerRuns, r.quotaString(), r.seeding.Round(time.Second))
}

func d(x time.Duration) string { return x.Round(time.Millisecond).String() }

// check fails the run on any answer but 2xx or 429/503 with Retry-After, a reclaim that did
// not evict its node's VMs, a victim lost or terminated twice, an operation not completed,
// or a backlog that did not drain.
func (r *burstResult) check(b *testing.B) {
	var problems []string
	for s, n := range r.byStatus {
		if (s < 200 || s >= 300) && s != http.StatusTooManyRequests && s != http.StatusServiceUnavailable {
			problems = append(problems, fmt.Sprintf("%d answers %d", n, s))
		}
	}
	if r.transport > 0 {
		problems = append(problems, fmt.Sprintf("%d calls without an answer", r.transport))
	}
	if r.noRetryAfter > 0 {
		problems = append(problems, fmt.Sprintf("%d answers 429/503 without Retry-After", r.noRetryAfter))
	}
	if len(r.badAnswers) > 0 {
		problems = append(problems, fmt.Sprintf("%d reclaims not answered with their victims, e.g. %s", len(r.badAnswers), r.badAnswers[0]))
	}
	if r.hiddenCommits > 0 {
		problems = append(problems, fmt.Sprintf("%d reclaims committed behind an answer other than 200", r.hiddenCommits))
	}
	if r.lost > 0 || r.double > 0 {
		problems = append(problems, fmt.Sprintf("%d victims lost, %d terminated more than once", r.lost, r.double))
	}
	if r.failedOps > 0 {
		problems = append(problems, fmt.Sprintf("%d operations not completed", r.failedOps))
	}
	if !r.drained {
		problems = append(problems, fmt.Sprintf("backlog not drained within %s", r.cfg.drainWithin))
	}
	if len(problems) > 0 {
		b.Fatal(strings.Join(problems, "; "))
	}
}

// operationsIn lists every operation in state, page by page (the index is sharded).
func operationsIn(ctx context.Context, b *testing.B, state capacity.OperationState) []capacity.Operation {
	var all []capacity.Operation
	for cursor := ""; ; {
		page, next, err := store.OperationsInState(ctx, state, time.Now().Add(time.Hour), cursor, 1000)
		if err != nil {
			b.Fatalf("%s operations: %v", state, err)
		}
		all = append(all, page...)
		if cursor = next; cursor == "" {
			return all
		}
	}
}
