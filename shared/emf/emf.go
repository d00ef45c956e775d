// Package emf publishes the domain's metrics in CloudWatch embedded metric format: one JSON
// object per line on the function's stdout, which CloudWatch Logs turns into metrics with no
// PutMetricData call, no permission and no latency on the call. Lines are written directly,
// not through slog, so a LOG_LEVEL of warn or error never drops a metric.
//
// Every metric is in namespace Namespace with the dimension Environment (the function's
// APP_ENV); refusals are also by Action and Code. Each line carries the invocation's
// "trace_id" and, when known, the API's "request_id", to go from a data point to its logs.
package emf

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/trace"
)

// Namespace is the CloudWatch namespace of every metric of the service.
const Namespace = "Capacity"

// Dimension names: what the Recorder writes, and what the stack's alarms and dashboard name
// (infra/observability.go).
const (
	// DimensionEnvironment is every metric's: the function's APP_ENV.
	DimensionEnvironment = "Environment"
	// DimensionAction and DimensionCode are a refusal's: the call's action and its problem code.
	DimensionAction = "Action"
	DimensionCode   = "Code"
)

// Metric names: what the Recorder writes, and what the stack's alarms and dashboard name
// (infra/observability.go).
const (
	MetricRefusals                     = "Refusals"
	MetricReclaims                     = "Reclaims"
	MetricReclaimVictims               = "ReclaimVictims"
	MetricReclaimDryRuns               = "ReclaimDryRuns"
	MetricRateLimited                  = "RateLimited"
	MetricRateLimitUnchecked           = "RateLimitUnchecked"
	MetricIntakeRecordsRefused         = "IntakeRecordsRefused"
	MetricReclaimTerminationTime       = "ReclaimTerminationTime"
	MetricStartedReclaimOperations     = "StartedReclaimOperations"
	MetricRestartedReclaimOperations   = "RestartedReclaimOperations"
	MetricStartFailedReclaimOperations = "StartFailedReclaimOperations"
	MetricEndedByReconciler            = "EndedByReconciler"
	MetricReportedByReconciler         = "ReportedByReconciler"
	MetricReclaimStartsExhausted       = "ReclaimStartsExhausted"
	MetricStuckReclaimOperations       = "StuckReclaimOperations"
	MetricHeldReclaimOperations        = "HeldReclaimOperations"
	MetricHeldVMs                      = "HeldVMs"
)

// MetricNames are the names of every metric the Recorder writes.
var MetricNames = []string{
	MetricRefusals, MetricReclaims, MetricReclaimVictims, MetricReclaimDryRuns, MetricRateLimited,
	MetricRateLimitUnchecked, MetricIntakeRecordsRefused, MetricReclaimTerminationTime, MetricStartedReclaimOperations,
	MetricRestartedReclaimOperations, MetricStartFailedReclaimOperations, MetricEndedByReconciler,
	MetricReportedByReconciler, MetricReclaimStartsExhausted, MetricStuckReclaimOperations, MetricHeldReclaimOperations, MetricHeldVMs,
}

// Units of the metrics.
const (
	Count        = "Count"
	Milliseconds = "Milliseconds"
)

// Recorder writes metrics to W. It implements capacity.Metrics and is safe for concurrent
// use: each record is written whole, in one Write, under a lock.
type Recorder struct {
	Environment string // the Environment dimension (APP_ENV)
	// Now stamps each record (default time.Now).
	Now func() time.Time

	mu sync.Mutex
	w  io.Writer
}

var _ capacity.Metrics = (*Recorder)(nil)

// New returns a Recorder writing to w (os.Stdout in a function) for the environment.
func New(w io.Writer, environment string) *Recorder {
	return &Recorder{w: w, Environment: environment}
}

// Metric is one named value of a record.
type Metric struct {
	Name  string
	Unit  string
	Value float64
}

// Call records a capacity call: an applied reclaim's count and victims, a reclaim dry run,
// or a refusal by action and code. Other outcomes (an applied release or placement, a
// replay, a failure) are not metrics; API Gateway and Lambda count calls and errors.
func (r *Recorder) Call(ctx context.Context, c capacity.CallOutcome) {
	props := map[string]any{}
	if c.RequestID != "" {
		props["request_id"] = c.RequestID
	}
	switch {
	case c.Refusal != "":
		props[DimensionAction], props[DimensionCode] = c.Action, string(c.Refusal)
		r.Put(ctx, []string{DimensionAction, DimensionCode}, props, Metric{MetricRefusals, Count, 1})
	case c.Action == capacity.ActionReclaim && c.DryRun:
		r.Put(ctx, nil, props, Metric{MetricReclaimDryRuns, Count, 1})
	case c.Action == capacity.ActionReclaim && c.Applied:
		r.Put(ctx, nil, props, Metric{MetricReclaims, Count, 1}, Metric{MetricReclaimVictims, Count, float64(c.Victims)})
	}
}

var _ capacity.RateMetrics = (*Recorder)(nil)

// RateLimited records a call refused 429 for its key's rate (RateLimited; the key id is a
// property, not a dimension: one metric however many keys).
func (r *Recorder) RateLimited(ctx context.Context, keyID string) {
	r.Put(ctx, nil, map[string]any{"key_id": keyID}, Metric{MetricRateLimited, Count, 1})
}

// RateUnchecked records a call let through because the rate limiter's own write failed
// (RateLimitUnchecked).
func (r *Recorder) RateUnchecked(ctx context.Context, keyID string) {
	r.Put(ctx, nil, map[string]any{"key_id": keyID}, Metric{MetricRateLimitUnchecked, Count, 1})
}

// IntakeRecordRefused records a record reclaim-events refused because the intake queue did
// not recognise its receipt handle: something invoked the function directly
// (IntakeRecordsRefused; the message id is a property).
func (r *Recorder) IntakeRecordRefused(ctx context.Context, messageID string) {
	r.Put(ctx, nil, map[string]any{"message_id": messageID}, Metric{MetricIntakeRecordsRefused, Count, 1})
}

// OperationEnded records ReclaimTerminationTime: from the reclaim's commit to the end of its
// operation.
func (r *Recorder) OperationEnded(ctx context.Context, op capacity.Operation, endedAt time.Time) {
	ms := float64(endedAt.Sub(op.CreatedAt).Milliseconds())
	props := map[string]any{"reclaim_id": op.ID, "node": op.NodeID, "state": string(op.EndState())}
	r.Put(ctx, nil, props, Metric{MetricReclaimTerminationTime, Milliseconds, max(0, ms)})
}

// Reconciled records what a reconciler run did. Every count is written, zeros included, so
// the alarms on them see a data point every run.
func (r *Recorder) Reconciled(ctx context.Context, rep *capacity.ReconcileReport) {
	r.Put(ctx, nil, nil,
		Metric{MetricStartedReclaimOperations, Count, float64(len(rep.Started))},
		Metric{MetricRestartedReclaimOperations, Count, float64(len(rep.Restarted))},
		Metric{MetricStartFailedReclaimOperations, Count, float64(len(rep.StartFailed))},
		Metric{MetricEndedByReconciler, Count, float64(len(rep.Ended))},
		Metric{MetricReportedByReconciler, Count, float64(len(rep.Reported))},
		Metric{MetricReclaimStartsExhausted, Count, float64(len(rep.Exhausted))},
		Metric{MetricStuckReclaimOperations, Count, float64(len(rep.Stuck))},
		Metric{MetricHeldReclaimOperations, Count, float64(len(rep.Held))},
		Metric{MetricHeldVMs, Count, float64(heldVMs(rep.Held))},
	)
}

// Put writes one record of the metrics, dimensioned by Environment and the named extra
// dimensions, whose string values must be in props (with any other properties to carry).
func (r *Recorder) Put(ctx context.Context, dims []string, props map[string]any, metrics ...Metric) {
	if r == nil || r.w == nil || len(metrics) == 0 {
		return
	}
	env := r.Environment
	if env == "" {
		env = "unknown" // a dimension value may not be empty
	}
	line := make(map[string]any, len(props)+len(metrics)+4)
	for k, v := range props {
		line[k] = v
	}
	line[DimensionEnvironment] = env
	if id := trace.ID(ctx); id != "" {
		line["trace_id"] = id
	}
	declared := make([]map[string]string, len(metrics))
	for i, m := range metrics {
		declared[i] = map[string]string{"Name": m.Name, "Unit": m.Unit}
		line[m.Name] = m.Value
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	line["_aws"] = map[string]any{
		"Timestamp": now().UnixMilli(),
		"CloudWatchMetrics": []map[string]any{{
			"Namespace":  Namespace,
			"Dimensions": [][]string{append([]string{DimensionEnvironment}, dims...)},
			"Metrics":    declared,
		}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return // only plain values are put: cannot happen
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(b) // stdout: nowhere better to report a failure
}

// heldVMs counts the VMs the held operations hold.
func heldVMs(ops []capacity.Operation) int {
	n := 0
	for _, op := range ops {
		n += len(op.VMIDs)
	}
	return n
}
