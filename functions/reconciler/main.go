// Command reconciler runs on a schedule (every minute in AWS; `make invoke FN=reconciler`
// locally): it starts termination workflows that a crash or an outage left unstarted,
// restarts (a bounded number of times) those whose execution closed before the operation
// ended, ends operations whose outcomes are all recorded, and reports stuck ones.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/stepfn"
)

func main() {
	logger := config.Logger()
	env := config.Must(config.Required("STATE_TABLE", "STATE_MACHINE_ARN"))
	cfg := config.Must(config.AWS(context.Background()))
	store := dynamo.New(dynamodb.NewFromConfig(cfg), env["STATE_TABLE"], "")
	store.Retention = config.Must(config.Duration("HISTORY_RETENTION", 0)) // per environment; 0: the default
	r := &capacity.Reconciler{
		Store:       store,
		Workflow:    &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: env["STATE_MACHINE_ARN"]},
		StartAfter:  config.Must(config.Duration("START_AFTER", 30*time.Second)),
		StuckAfter:  config.Must(config.Duration("STUCK_AFTER", 15*time.Minute)),
		MaxRestarts: 3,
		Logger:      logger,
	}
	lambda.Start(handler(r, logger))
}

// Result is what an invocation returns (visible to `make invoke` and tests).
type Result struct {
	Started     []string `json:"started"`
	Restarted   []string `json:"restarted"`
	StartFailed []string `json:"startFailed"`
	Ended       []string `json:"ended"`
	Exhausted   []string `json:"exhausted"`
	Stuck       []string `json:"stuck"`
}

// handler runs one reconciliation for any event (the schedule's, or an empty one on demand).
func handler(r *capacity.Reconciler, logger *slog.Logger) func(context.Context, json.RawMessage) (Result, error) {
	return func(ctx context.Context, _ json.RawMessage) (Result, error) {
		report, err := r.Run(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("reconcile: %w", err)
		}
		res := Result{
			Started: nonNil(report.Started), Restarted: nonNil(report.Restarted), StartFailed: nonNil(report.StartFailed),
			Ended: nonNil(report.Ended), Exhausted: []string{}, Stuck: []string{},
		}
		for _, op := range report.Exhausted {
			res.Exhausted = append(res.Exhausted, op.ID)
		}
		for _, op := range report.Stuck {
			res.Stuck = append(res.Stuck, op.ID)
		}
		emitMetrics(logger, res)
		return res, nil
	}
}

// emitMetrics writes CloudWatch embedded-metric-format: CloudWatch turns this log line into
// metrics (alarm on StuckReclaimOperations > 0 and ReclaimStartsExhausted > 0), with no
// PutMetricData call or permission.
func emitMetrics(logger *slog.Logger, res Result) {
	logger.Info("reconcile",
		slog.Any("_aws", map[string]any{
			"Timestamp": time.Now().UnixMilli(),
			"CloudWatchMetrics": []map[string]any{{
				"Namespace":  "Capacity/Reclaim",
				"Dimensions": [][]string{{}},
				"Metrics": []map[string]string{
					{"Name": "StartedReclaimOperations", "Unit": "Count"},
					{"Name": "RestartedReclaimOperations", "Unit": "Count"},
					{"Name": "StartFailedReclaimOperations", "Unit": "Count"},
					{"Name": "EndedByReconciler", "Unit": "Count"},
					{"Name": "ReclaimStartsExhausted", "Unit": "Count"},
					{"Name": "StuckReclaimOperations", "Unit": "Count"},
				},
			}},
		}),
		slog.Int("StartedReclaimOperations", len(res.Started)),
		slog.Int("RestartedReclaimOperations", len(res.Restarted)),
		slog.Int("StartFailedReclaimOperations", len(res.StartFailed)),
		slog.Int("EndedByReconciler", len(res.Ended)),
		slog.Int("ReclaimStartsExhausted", len(res.Exhausted)),
		slog.Int("StuckReclaimOperations", len(res.Stuck)))
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
