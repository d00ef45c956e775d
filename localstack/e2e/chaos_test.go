package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/capacity"
)

// The chaos run's shape. CHAOS_DURATION (e.g. "5m") turns it on and bounds the load; every
// loop below stops at that deadline or at a bound of its own.
const (
	chaosNodes = 6
	// chaosKillEvery: how often a random bootstrap of a random function is killed.
	chaosKillEvery = 10 * time.Second
	// chaosVisibility: the request queue's visibility timeout during the run (360 s deployed),
	// so that a request whose delivery failed comes back within the run. It is shorter than
	// reclaim-events' timeout: a slow delivery may meet its own redelivery, which at-least-once
	// delivery allows anyway.
	chaosVisibility = 30
	// chaosKillSlack: a gateway answer this long around a kill of the api bootstrap counts as
	// on an injected path.
	chaosKillSlack = 2 * time.Second
)

var chaosUnits = []string{"gpu-2", "gpu-3", "gpu-4", "gpu-5"}

// TestChaos drives the whole local stack at once for CHAOS_DURATION (make soak): on
// chaosNodes nodes, each cycle releases units, places spot VMs on them and reclaims them by
// HTTP (with or without a dry run and If-Match, with or without grace), by event, or by a
// scheduled reclaim, follows the termination to its end and re-drives it if it failed; beside
// them readers, the reconciler every second, a redeliverer that sends delivered requests to
// the queue again, duplicate event puts and duplicate scheduler firings, and a killer that
// SIGKILLs a random function bootstrap every chaosKillEvery; the functions run under the AWS
// fault layer (E2E_FAULTS) and the agents fail 30% of terminate calls. At the end: every
// operation completed (or failed with a reason after its re-drives), every evicted VM
// terminated exactly once on its agent, every invariant holds, every audit chain verifies,
// each successful call was applied once, no 5xx off an injected path, nothing left in the
// queues. It prints the figures of docs/numbers.md, "Reliability".
func TestChaos(t *testing.T) {
	d := os.Getenv("CHAOS_DURATION")
	if d == "" {
		t.Skip("set CHAOS_DURATION (make soak does)")
	}
	duration, err := time.ParseDuration(d)
	if err != nil || duration <= 0 {
		t.Fatalf("CHAOS_DURATION=%q: want a positive duration", d)
	}
	requireFaults(t)
	if localStack == nil {
		t.Skip("needs the local stack this process starts (its bootstraps are killed)")
	}
	c := &chaos{start: time.Now(), deadline: time.Now().Add(duration), faults: map[string]int{}, recovered: map[string]int{},
		kills: map[string][]time.Time{}, cycles: map[string]int{}}
	restoreVisibility := setVisibility(t, chaosVisibility)
	defer restoreVisibility()

	nodes := make([]string, chaosNodes)
	for i := range nodes {
		nodes[i] = newNode(t, nil)
		agents.SetFaultRate(nodes[i], "", agentFaultRate)
	}
	agentFaultsBefore := agents.RandomFaults()
	_, restartsBefore := localStack.Processes(outputs["ApiFunctionName"])
	watches := make(map[string]*busWatch, len(nodes))
	for _, n := range nodes {
		watches[n] = outcomeWatch(t, n)
	}
	stopRedeliver := c.redeliver(t, nodes)
	stopReconciler := c.reconcile(t)

	t.Run("load", func(t *testing.T) {
		for i, node := range nodes {
			t.Run("node-"+strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				c.worker(t, node, watches[node], rand.New(rand.NewPCG(uint64(i), uint64(c.start.UnixNano()))))
			})
		}
		t.Run("readers", func(t *testing.T) {
			t.Parallel()
			c.readers(t, nodes)
		})
		t.Run("killer", func(t *testing.T) {
			t.Parallel()
			c.killer(t)
		})
	})
	stopRedeliver()
	c.drainQueue(t)
	recon := stopReconciler()

	// Every bootstrap killed was started again.
	for _, fn := range chaosFunctions() {
		waitUntil(t, 10*time.Second, fn+" back at full strength", func() bool {
			running, _ := localStack.Processes(fn)
			return running == localProcesses()
		})
	}
	_, restarts := localStack.Processes(outputs["ApiFunctionName"])
	c.recovered["bootstrap started again after a kill or crash"] = restarts - restartsBefore
	if c.totalKills() > restarts-restartsBefore {
		t.Errorf("%d bootstraps killed, %d started again", c.totalKills(), restarts-restartsBefore)
	}
	for k, v := range recon {
		c.recovered["reconciler: "+k] = v
	}
	c.faults["agent terminate call failed (500 or dropped)"] = agents.RandomFaults() - agentFaultsBefore
	for k, v := range injectedFaults(t) {
		c.faults["AWS "+k] = v
	}

	c.checkNodes(t, nodes)
	c.checkOutcomes(t, watches)
	c.checkQueues(t)
	for _, u := range c.unexpected {
		t.Errorf("5xx or transport error off an injected path: %s", u)
	}
	c.report(t)
}

// chaos is one run's shared state.
type chaos struct {
	start, deadline time.Time
	calls           atomic.Int64

	mu         sync.Mutex
	faults     map[string]int // injected, by kind
	recovered  map[string]int // recoveries, by kind
	unexpected []string       // 5xx and transport errors off an injected path
	ops        []*chaosOp
	kills      map[string][]time.Time // function -> when one of its bootstraps was killed
	cycles     map[string]int         // node -> cycles done
	maxFree    time.Duration          // the longest time from a reclaim's answer to its units free
	maxFreeOp  string
	outcomes   int // request outcomes read from the bus, every one checked
	// The same for the operations that failed and were re-driven.
	maxFreeRedriven   time.Duration
	maxFreeRedrivenOp string
}

// chaosOp is one reclaim of the run and what became of it.
type chaosOp struct {
	node, via, reclaimID string
	victims              []string
	answered             time.Time // the reclaim's answer (its outcome event, its scheduled firing)
	grace                time.Duration
	state                string
	redrives             int
	// dead: a VM whose agent fails every call until the operation has failed, then recovers
	// (a node rebooting): the operation fails and its re-drive completes it.
	dead string
}

func (c *chaos) add(m map[string]int, kind string, n int) {
	c.mu.Lock()
	m[kind] += n
	c.mu.Unlock()
}

func (c *chaos) totalKills() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.kills {
		n += len(k)
	}
	return n
}

// apiKilledDuring reports whether an api bootstrap was killed while a call was under way.
func (c *chaos) apiKilledDuring(sent, answered time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.kills[outputs["ApiFunctionName"]] {
		if !k.Before(sent.Add(-chaosKillSlack)) && !k.After(answered) {
			return true
		}
	}
	return false
}

// call sends a request through the gateway and sends it again while retrying is safe: 503
// throttled and 409 concurrent_modification, as the API says, and any 5xx or lost answer
// while an api bootstrap was killed (every write the run sends carries an Idempotency-Key).
// Any other 5xx or transport error is recorded as unexpected, and retried so the run goes on.
func (c *chaos) call(t testing.TB, method, path, key string, body any, header ...string) response {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		c.calls.Add(1)
		sent := time.Now()
		r, reqHeader, reqBody, err := send(method, path, key, body, header...)
		answered := time.Now()
		var kind string
		switch code := problemCode(r); {
		case err != nil:
			kind = "lost answer (" + err.Error() + ")"
			if c.apiKilledDuring(sent, answered) {
				kind = "lost answer while an api bootstrap was killed"
			} else {
				c.noteUnexpected(fmt.Sprintf("%s %s: %v", method, path, err))
			}
		case r.Status == http.StatusServiceUnavailable && code == "throttled",
			r.Status == http.StatusConflict && code == "concurrent_modification":
			kind = fmt.Sprint(r.Status, " ", code)
		case r.Status == http.StatusTooManyRequests:
			// Over the key's own rate limit: wait as told.
			kind = fmt.Sprint(r.Status, " ", code)
			if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err == nil {
				wait = max(wait, time.Duration(s)*time.Second/2)
			}
		case r.Status >= 500 && c.apiKilledDuring(sent, answered):
			kind = fmt.Sprint(r.Status, " while an api bootstrap was killed")
		case r.Status >= 500:
			kind = fmt.Sprint(r.Status, " ", code)
			c.noteUnexpected(fmt.Sprintf("%s %s: %d %s", method, path, r.Status, r.Body))
		default:
			checkContract(t, method, path, reqHeader, reqBody, r)
			return r
		}
		c.add(c.recovered, "client retry after "+kind, 1)
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: still %s after 3 minutes of retries", method, path, kind)
		}
		time.Sleep(wait)
	}
}

func (c *chaos) noteUnexpected(s string) {
	c.mu.Lock()
	c.unexpected = append(c.unexpected, s)
	c.mu.Unlock()
}

// send is one HTTP request through the gateway, without failing the test on a lost answer.
func send(method, path, key string, body any, header ...string) (response, http.Header, []byte, error) {
	var reqBody []byte
	if body != nil {
		var err error
		if reqBody, err = json.Marshal(body); err != nil {
			return response{}, nil, nil, err
		}
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(apiURL, "/")+path, bytes.NewReader(reqBody))
	if err != nil {
		return response{}, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return response{}, req.Header, reqBody, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, req.Header, reqBody, err
	}
	return response{resp.StatusCode, resp.Header, raw}, req.Header, reqBody, nil
}

// problemCode is the code of a problem answer ("" for anything else).
func problemCode(r response) string {
	if r.Status < 400 {
		return ""
	}
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(r.Body, &p)
	return p.Code
}

// worker runs cycles on one node until the deadline: release (after the first), place two
// spot VMs, reclaim the four released units one of three ways, follow the operation to its
// end. Nothing else writes to the node, so every answer is known in advance.
func (c *chaos) worker(t *testing.T, node string, w *busWatch, rnd *rand.Rand) {
	victims := []string{"vm-spot-1", "vm-spot-2"}
	k := 0
	defer func() { // also after a failure, so that the end checks count what was done
		c.mu.Lock()
		c.cycles[node] = k
		c.mu.Unlock()
	}()
	for ; time.Now().Before(c.deadline); k++ {
		if k > 0 {
			r := c.call(t, http.MethodPost, releasePath(node), keyOwner, map[string]any{"unitIds": chaosUnits}, "Idempotency-Key", fmt.Sprintf("rel-%d", k))
			if r.Status != http.StatusOK || !slices.Equal(sorted(strs(r.json(t)["releasedUnitIds"])), chaosUnits) {
				t.Fatalf("cycle %d: release: %d %s", k, r.Status, r.Body)
			}
		}
		for i, unit := range []string{"gpu-4", "gpu-5"} {
			vm := fmt.Sprintf("vm-c%d-%d", k, i)
			r := c.call(t, http.MethodPost, "/v1/nodes/"+node+"/vms", keyOperator,
				map[string]any{"vmId": vm, "orgId": demo.OrgBuyer, "tier": "spot", "unitIds": []string{unit}}, "Idempotency-Key", "place-"+vm)
			if r.Status != http.StatusCreated {
				t.Fatalf("cycle %d: place %s: %d %s", k, vm, r.Status, r.Body)
			}
			if err := agents.AddVM(node, vm, "running"); err != nil {
				t.Fatal(err)
			}
			victims = append(victims, vm)
		}
		slices.Sort(victims)
		op := &chaosOp{node: node, victims: slices.Clone(victims)}
		if rnd.IntN(8) == 0 {
			op.dead = victims[rnd.IntN(len(victims))]
			agents.FailAlways(node, op.dead, true)
			c.add(c.faults, "agent down for a VM until its operation failed", 1)
		}
		switch rnd.IntN(3) {
		case 0:
			c.reclaimHTTP(t, op, k, rnd)
		case 1:
			c.reclaimEvent(t, op, k, w, rnd)
		default:
			c.reclaimScheduled(t, op, k, rnd)
		}
		c.follow(t, op)
		victims = victims[:0]
	}
}

func (c *chaos) reclaimHTTP(t *testing.T, op *chaosOp, k int, rnd *rand.Rand) {
	op.via = "http"
	grace := rnd.IntN(2) * 2
	header := []string{"Idempotency-Key", fmt.Sprintf("rcl-%d", k)}
	if rnd.IntN(2) == 0 {
		// The plan's tag covers the grace: the dry run asks for the same.
		dry := c.call(t, http.MethodPost, reclaimPath(op.node), keyOwner, map[string]any{"unitIds": chaosUnits, "graceSeconds": grace, "dryRun": true})
		if dry.Status != http.StatusOK || !slices.Equal(sorted(strs(dry.json(t)["wouldTerminate"])), op.victims) {
			t.Fatalf("cycle %d: dry run: %d %s, want wouldTerminate %v", k, dry.Status, dry.Body, op.victims)
		}
		header = append(header, "If-Match", dry.Header.Get("ETag"))
		op.via = "http after a dry run, If-Match"
	}
	r := c.call(t, http.MethodPost, reclaimPath(op.node), keyOwner,
		map[string]any{"unitIds": chaosUnits, "reason": "chaos", "graceSeconds": grace}, header...)
	op.answered = time.Now()
	if r.Status != http.StatusOK {
		t.Fatalf("cycle %d: reclaim: %d %s", k, r.Status, r.Body)
	}
	body := r.json(t)
	if got := sorted(strs(body["terminated"])); !slices.Equal(got, op.victims) {
		t.Fatalf("cycle %d: reclaim answered terminated %v, want %v", k, got, op.victims)
	}
	op.reclaimID, _ = body["reclaimId"].(string)
	op.grace = time.Duration(grace) * time.Second
}

// reclaimEvent puts the request on the bus as the platform's scheduler, a third of the time
// twice (one idempotency key), and reads its outcome from the bus.
func (c *chaos) reclaimEvent(t *testing.T, op *chaosOp, k int, w *busWatch, rnd *rand.Rand) {
	op.via = "event"
	d := map[string]any{"nodeId": op.node, "reservationId": demo.ReservationID, "unitIds": chaosUnits,
		"actingOrgId": demo.OrgPlatform, "reason": "chaos event", "idempotencyKey": fmt.Sprintf("ev-%s-%d", op.node, k)}
	id := putRequest(t, capacity.SourcePlatformScheduler, d)
	if rnd.IntN(3) == 0 {
		putRequest(t, capacity.SourcePlatformScheduler, d)
		c.add(c.faults, "duplicate event put (one idempotency key)", 1)
	}
	ev := w.await("the outcome of request "+id, 1, 4*time.Minute, byRequest(id))[0]
	op.answered = ev.received
	result, _ := ev.detail["result"].(map[string]any)
	if ev.DetailType != capacity.DetailReclaimCompleted || result == nil || !slices.Equal(sorted(strs(result["terminated"])), op.victims) {
		t.Fatalf("cycle %d: outcome %s: %s, want terminated %v", k, ev.DetailType, ev.Detail, op.victims)
	}
	op.reclaimID, _ = result["reclaimId"].(string)
}

// reclaimScheduled schedules the reclaim a few seconds ahead and, half of the time, fires it
// a second time itself at its time, as a duplicate firing of the scheduler would.
func (c *chaos) reclaimScheduled(t *testing.T, op *chaosOp, k int, rnd *rand.Rand) {
	op.via = "scheduled"
	var at time.Time
	var r response
	for try := 0; ; try++ {
		at = time.Now().UTC().Add(8 * time.Second).Truncate(time.Second)
		r = c.call(t, http.MethodPost, reclaimPath(op.node), keyOwner,
			map[string]any{"unitIds": chaosUnits, "reason": "chaos scheduled", "at": at.Format(time.RFC3339)}, "Idempotency-Key", fmt.Sprintf("sched-%d-%d", k, try))
		// Retries that outlast at: the first attempt did not land (a replay would answer 202),
		// so the client schedules again, at a later time under a new key.
		if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "at must be in the future") || try == 2 {
			break
		}
		c.add(c.recovered, "scheduled again after retries outlasted its at", 1)
	}
	if r.Status != http.StatusAccepted {
		t.Fatalf("cycle %d: schedule: %d %s", k, r.Status, r.Body)
	}
	sid, _ := r.json(t)["id"].(string)
	if rnd.IntN(2) == 0 {
		time.Sleep(time.Until(at))
		raw, _ := json.Marshal(map[string]any{"nodeId": op.node, "reservationId": demo.ReservationID, "scheduledReclaimId": sid})
		out, err := ebClient().PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
			EventBusName: aws.String(outputs["EventBusName"]), Source: aws.String(capacity.SourceSchedule),
			DetailType: aws.String(capacity.DetailReclaimRequested), Detail: aws.String(string(raw)),
		}}})
		if err != nil || out.FailedEntryCount > 0 {
			t.Fatalf("duplicate firing: %v %+v", err, out)
		}
		c.add(c.faults, "duplicate scheduler firing", 1)
	}
	path := "/v1/nodes/" + op.node + "/reservations/" + demo.ReservationID + "/scheduled-reclaims/" + sid
	deadline := time.Now().Add(4 * time.Minute)
	for {
		g := c.call(t, http.MethodGet, path, keyOwner, nil)
		if g.Status != http.StatusOK {
			t.Fatalf("cycle %d: GET scheduled reclaim: %d %s", k, g.Status, g.Body)
		}
		s := g.json(t)
		if s["state"] == "completed" {
			op.reclaimID, _ = s["reclaimId"].(string)
			fired, err := time.Parse(time.RFC3339Nano, fmt.Sprint(s["firedAt"]))
			if err != nil {
				t.Fatalf("cycle %d: scheduled reclaim firedAt: %s", k, g.Body)
			}
			op.answered = fired
			return
		}
		if s["state"] != "scheduled" {
			t.Fatalf("cycle %d: scheduled reclaim ended %s: %s", k, s["state"], g.Body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("cycle %d: scheduled reclaim still scheduled 4 minutes after %s", k, at)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// follow waits for the operation to end; a failed one is re-driven (at most 3 times).
func (c *chaos) follow(t *testing.T, op *chaosOp) {
	c.mu.Lock()
	c.ops = append(c.ops, op)
	c.mu.Unlock()
	base := "/v1/nodes/" + op.node + "/reservations/" + demo.ReservationID + "/reclaims/" + op.reclaimID
	for {
		var o map[string]any
		deadline := time.Now().Add(5 * time.Minute)
		for {
			r := c.call(t, http.MethodGet, base, keyManager, nil)
			if r.Status != http.StatusOK {
				t.Fatalf("GET operation %s: %d %s", op.reclaimID, r.Status, r.Body)
			}
			if o = r.json(t); o["state"] == "completed" || o["state"] == "failed" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("operation %s (%s) still %s after 5 minutes: %s", op.reclaimID, op.via, o["state"], r.Body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		got := outcomes(o)
		if !slices.Equal(slices.Sorted(maps.Keys(got)), op.victims) {
			t.Fatalf("operation %s (%s) has outcomes for %v, want %v", op.reclaimID, op.via, got, op.victims)
		}
		op.state, _ = o["state"].(string)
		if op.state == "completed" {
			updated, err := time.Parse(time.RFC3339Nano, fmt.Sprint(o["updatedAt"]))
			if err != nil {
				t.Fatalf("operation %s updatedAt: %v", op.reclaimID, err)
			}
			free := updated.Sub(op.answered) - op.grace
			c.mu.Lock()
			// An operation re-driven after a dead agent waited for the re-drive: its own figure.
			longest, which := &c.maxFree, &c.maxFreeOp
			if op.redrives > 0 {
				longest, which = &c.maxFreeRedriven, &c.maxFreeRedrivenOp
			}
			if free > *longest {
				*longest, *which = free, fmt.Sprintf("%s (%s, %d VMs, %d re-drives)", op.reclaimID, op.via, len(op.victims), op.redrives)
			}
			c.mu.Unlock()
			return
		}
		if op.dead != "" {
			agents.FailAlways(op.node, op.dead, false) // the agent is back: the re-drive can succeed
			op.dead = ""
		}
		if op.redrives == 3 {
			// Failed after its re-drives: each VM still unfinished names its error.
			for _, v := range o["vms"].([]any) {
				vm := v.(map[string]any)
				if vm["outcome"] == "failed" && vm["error"] == nil {
					t.Errorf("operation %s: VM %s failed with no reason: %v", op.reclaimID, vm["vmId"], vm)
				}
			}
			return
		}
		op.redrives++
		r := c.call(t, http.MethodPost, base+"/retry", keyOwner, nil, "Idempotency-Key", fmt.Sprintf("redrive-%s-%d", op.reclaimID, op.redrives))
		if r.Status != http.StatusAccepted && r.Status != http.StatusOK {
			t.Fatalf("re-drive %s: %d %s", op.reclaimID, r.Status, r.Body)
		}
		c.add(c.recovered, "re-drive of a failed operation", 1)
	}
}

// readers read and dry-run on the nodes, as the marketplace and tenants do, until the deadline.
func (c *chaos) readers(t *testing.T, nodes []string) {
	rnd := rand.New(rand.NewPCG(99, uint64(c.start.UnixNano())))
	for time.Now().Before(c.deadline) {
		node := nodes[rnd.IntN(len(nodes))]
		var r response
		if rnd.IntN(2) == 0 {
			r = c.call(t, http.MethodGet, "/v1/nodes/"+node+"/reservations/"+demo.ReservationID, keyAudience, nil)
		} else {
			// gpu-0 and gpu-1 are reserved and never released: a plan that is always the same.
			r = c.call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-0", "gpu-1"}, "dryRun": true})
		}
		if r.Status != http.StatusOK {
			t.Errorf("reader on %s: %d %s", node, r.Status, r.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// chaosFunctions are the functions whose bootstraps the killer kills.
func chaosFunctions() []string {
	return []string{outputs["ApiFunctionName"], outputs["TerminateNodeFunctionName"], outputs["ReclaimEventsFunctionName"],
		outputs["ReconcilerFunctionName"], outputs["OperationEventsFunctionName"]}
}

// killer kills a random bootstrap of a random function every chaosKillEvery until the deadline.
func (c *chaos) killer(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, uint64(c.start.UnixNano())))
	fns := chaosFunctions()
	for {
		wait := chaosKillEvery/2 + time.Duration(rnd.Int64N(int64(chaosKillEvery)))
		if time.Now().Add(wait).After(c.deadline) {
			return
		}
		time.Sleep(wait)
		fn := fns[rnd.IntN(len(fns))]
		if _, err := localStack.KillProcess(fn, rnd.IntN(64)); err != nil {
			t.Errorf("kill a bootstrap of %s: %v", fn, err)
			continue
		}
		c.mu.Lock()
		c.kills[fn] = append(c.kills[fn], time.Now())
		c.mu.Unlock()
		c.add(c.faults, "bootstrap killed: "+strings.TrimPrefix(fn, "capacity-local-"), 1)
	}
}

// redeliver watches the requests delivered for the nodes and sends a third of them to the
// request queue again, as SQS delivers a message twice, until stopped.
func (c *chaos) redeliver(t *testing.T, nodes []string) (stop func()) {
	w := watchBus(t, map[string]any{
		"source":      []string{capacity.SourcePlatformScheduler, capacity.SourceSchedule},
		"detail-type": []string{capacity.DetailReclaimRequested},
		"detail":      map[string]any{"nodeId": nodes},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	q := sqsClient()
	rnd := rand.New(rand.NewPCG(5, uint64(c.start.UnixNano())))
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := q.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(w.queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("read the request watch: %v", err)
				}
				return
			}
			for _, m := range out.Messages {
				if rnd.IntN(3) == 0 {
					if _, err := q.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(outputs["ReclaimRequestsQueueUrl"]), MessageBody: m.Body}); err != nil {
						t.Errorf("redeliver a request: %v", err)
					} else {
						c.add(c.faults, "SQS redelivery of a delivered request", 1)
					}
				}
				_, _ = q.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(w.queueURL), ReceiptHandle: m.ReceiptHandle})
			}
		}
	}()
	return func() { cancel(); <-done }
}

// reconcile invokes the reconciler every second, as its schedule does on AWS, and tallies
// what its runs did, until stopped.
func (c *chaos) reconcile(t *testing.T) (stop func() map[string]int) {
	lc := lambda.NewFromConfig(stack.AWSConfig(endpoint))
	ctx, cancel := context.WithCancel(context.Background())
	tally := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(outputs["ReconcilerFunctionName"]), Payload: []byte(`{}`)})
			switch {
			case err != nil || out.FunctionError != nil:
				// Under the faults, or its bootstrap killed: the next run takes over.
				tally["run failed, the next took over"]++
			default:
				var res map[string]json.RawMessage // lists of ids, and flags such as drainCut
				if err := json.Unmarshal(out.Payload, &res); err != nil {
					t.Errorf("reconciler answer: %v: %s", err, out.Payload)
				}
				for k, raw := range res {
					var ids []string
					if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
						tally[k] += len(ids)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() map[string]int {
		cancel()
		<-done
		return tally
	}
}

// drainQueue waits until the request queue is empty (the redeliveries and retries handled).
func (c *chaos) drainQueue(t *testing.T) {
	waitUntil(t, 3*time.Minute, "the request queue drained", func() bool {
		return queueDepth(t, outputs["ReclaimRequestsQueueUrl"]) == 0
	})
}

func queueDepth(t *testing.T, url string) int {
	out, err := sqsClient().GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatalf("queue attributes of %s: %v", url, err)
	}
	n := 0
	for _, v := range out.Attributes {
		x, _ := strconv.Atoi(v)
		n += x
	}
	return n
}

func setVisibility(t *testing.T, seconds int) (restore func()) {
	q, url := sqsClient(), aws.String(outputs["ReclaimRequestsQueueUrl"])
	out, err := q.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: url,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameVisibilityTimeout}})
	if err != nil {
		t.Fatalf("visibility timeout of the request queue: %v", err)
	}
	set := func(v string) error {
		_, err := q.SetQueueAttributes(context.Background(), &sqs.SetQueueAttributesInput{QueueUrl: url,
			Attributes: map[string]string{string(sqstypes.QueueAttributeNameVisibilityTimeout): v}})
		return err
	}
	if err := set(strconv.Itoa(seconds)); err != nil {
		t.Fatalf("set the request queue's visibility timeout: %v", err)
	}
	before := out.Attributes[string(sqstypes.QueueAttributeNameVisibilityTimeout)]
	return func() { _ = set(before) }
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("%s: not within %s", what, within)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// localProcesses is the number of bootstraps per function the stack was started with.
func localProcesses() int {
	if v := os.Getenv("E2E_PROCESSES"); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	return 4
}

// checkNodes checks the end state of every node against what the run did.
func (c *chaos) checkNodes(t *testing.T, nodes []string) {
	evicted := map[string]*chaosOp{} // node/vm -> its operation
	for _, op := range c.ops {
		if op.state != "completed" && op.state != "failed" {
			t.Errorf("operation %s (%s) on %s never ended", op.reclaimID, op.via, op.node)
		}
		for _, vm := range op.victims {
			if prev := evicted[op.node+"/"+vm]; prev != nil {
				t.Errorf("%s on %s evicted by %s and %s", vm, op.node, prev.reclaimID, op.reclaimID)
			}
			evicted[op.node+"/"+vm] = op
		}
	}
	for _, node := range nodes {
		st := loadNode(t, node)
		for _, v := range capacity.Violations(st, time.Now()) {
			t.Errorf("node %s: invariant violated: %s", node, v)
		}
		for _, vm := range st.VMs {
			op := evicted[node+"/"+vm.ID]
			switch {
			case vm.State == capacity.VMTerminating && (op == nil || op.state != "failed"):
				t.Errorf("node %s: VM %s still terminating after every operation ended", node, vm.ID)
			case vm.State == capacity.VMTerminated && op == nil:
				t.Errorf("node %s: VM %s terminated, yet no reclaim of the run evicted it", node, vm.ID)
			case op != nil && op.state == "completed" && vm.State != capacity.VMTerminated:
				t.Errorf("node %s: VM %s is %s after its operation %s completed", node, vm.ID, vm.State, op.reclaimID)
			}
			// The agent is the witness: each evicted VM terminated exactly once, no other ever.
			want := 0
			if vm.State == capacity.VMTerminated {
				want = 1
			}
			if n := agents.Terminations(node, vm.ID); n != want {
				t.Errorf("node %s: VM %s (%s) terminated %d times on its agent, want %d", node, vm.ID, vm.State, n, want)
			}
		}
		for _, vm := range []string{"vm-res-1", "vm-od-1"} {
			if n := agents.TerminateCalls(node, vm); n != 0 {
				t.Errorf("node %s: VM %s, never evicted, got %d terminate calls", node, vm, n)
			}
		}
		// Each successful call applied once: one audit record each, however often sent.
		cycles := c.cycles[node]
		want := map[string]int{capacity.ActionReclaim: cycles, capacity.ActionRelease: max(cycles-1, 0), capacity.ActionPlace: 2 * cycles}
		got := auditOK(t, node)
		for a, n := range want {
			if got[a] != n {
				t.Errorf("node %s: %d successful %s records, want %d (%d cycles)", node, got[a], a, n, cycles)
			}
		}
		for _, chain := range capacity.NodeChains {
			verifyChain(t, "node "+node+" "+string(chain), func(cursor string) (capacity.AuditHead, []capacity.AuditRecord, string, error) {
				return store.NodeAudit(context.Background(), node, chain, 500, cursor)
			})
		}
	}
	verifyChain(t, "keys", func(cursor string) (capacity.AuditHead, []capacity.AuditRecord, string, error) {
		return store.KeyAudit(context.Background(), 500, cursor)
	})
}

// verifyChain reads a whole audit chain and verifies it against its head.
func verifyChain(t *testing.T, name string, page func(cursor string) (capacity.AuditHead, []capacity.AuditRecord, string, error)) {
	t.Helper()
	var head capacity.AuditHead
	var records []capacity.AuditRecord
	cursor := ""
	for first := true; first || cursor != ""; first = false {
		h, recs, next, err := page(cursor)
		if err != nil {
			t.Errorf("audit chain of %s: %v", name, err)
			return
		}
		if first {
			head = h
		}
		records, cursor = append(records, recs...), next
	}
	if rep := capacity.VerifyAuditChain(head, records); !rep.OK || rep.Past != 0 {
		t.Errorf("audit chain of %s does not verify: %+v", name, rep)
	}
}

// checkOutcomes reads every outcome published for the nodes' requests (first deliveries,
// duplicate puts, redeliveries, duplicate firings): each is a completion naming a reclaim the
// run followed, never a refusal or a reclaim of its own.
func (c *chaos) checkOutcomes(t *testing.T, watches map[string]*busWatch) {
	known := map[string]bool{}
	for _, op := range c.ops {
		known[op.node+"/"+op.reclaimID] = true
	}
	outcomes, replays := 0, 0
	for node, w := range watches {
		for n := -1; n != len(w.seen); { // until a receive brings nothing more
			n = len(w.seen)
			w.receive()
		}
		first := map[string]bool{}
		for _, ev := range w.seen {
			outcomes++
			result, _ := ev.detail["result"].(map[string]any)
			id, _ := result["reclaimId"].(string)
			if ev.DetailType != capacity.DetailReclaimCompleted || !known[node+"/"+id] {
				t.Errorf("node %s: outcome %s names no reclaim of the run: %s", node, ev.DetailType, ev.Detail)
				continue
			}
			if first[id] {
				replays++
			}
			first[id] = true
		}
	}
	c.add(c.recovered, "request delivered again answered with its first reclaim", replays)
	c.mu.Lock()
	c.outcomes = outcomes
	c.mu.Unlock()
}

// checkQueues: nothing dead-lettered, nothing left.
func (c *chaos) checkQueues(t *testing.T) {
	if n := queueDepth(t, outputs["ReclaimRequestsDeadLetterQueueUrl"]); n != 0 {
		t.Errorf("%d requests dead-lettered", n)
	}
}

var faultLine = regexp.MustCompile(`awsfault injected.*?(?:"fault":"|fault=)(\w+).*?(?:"operation":"|operation=)(\w+)`)

// injectedFaults counts the AWS faults the functions' processes logged, by fault and operation.
func injectedFaults(t *testing.T) map[string]int {
	logs, _ := filepath.Glob(filepath.Join("..", "..", "build", "local", "logs", "*.log"))
	out := map[string]int{}
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			t.Errorf("function log: %v", err)
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := faultLine.FindStringSubmatch(sc.Text()); m != nil {
				out[m[1]+" on "+m[2]]++
			}
		}
		f.Close()
	}
	return out
}

// report prints the run's figures.
func (c *chaos) report(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	byVia, byState, redriven := map[string]int{}, map[string]int{}, 0
	for _, op := range c.ops {
		byVia[op.via]++
		byState[op.state]++
		if op.redrives > 0 {
			redriven++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %d nodes, load %s, drained and checked after %s\n", chaosNodes, c.deadline.Sub(c.start).Round(time.Second), time.Since(c.start).Round(time.Second))
	fmt.Fprintf(&b, "operations: %d HTTP calls sent (retries included); %d reclaims %v, ended %v, %d re-driven; %d request outcomes on the bus\n",
		c.calls.Load(), len(c.ops), byVia, byState, redriven, c.outcomes)
	list := func(title string, m map[string]int) {
		total := 0
		for _, n := range m {
			total += n
		}
		fmt.Fprintf(&b, "%s: %d\n", title, total)
		keys := slices.Collect(maps.Keys(m))
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %7d  %s\n", m[k], k)
		}
	}
	list("faults injected", c.faults)
	list("recoveries", c.recovered)
	fmt.Fprintf(&b, "longest from a reclaim's answer to its units free (grace excluded): %s, %s; with a re-drive: %s, %s\n",
		c.maxFree.Round(time.Millisecond), c.maxFreeOp, c.maxFreeRedriven.Round(time.Millisecond), c.maxFreeRedrivenOp)
	fmt.Fprintf(&b, "5xx or lost answers off an injected path: %d\n", len(c.unexpected))
	t.Log("\n" + b.String())
}
