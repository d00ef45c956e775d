package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/openrelay/capacity/shared/calllog"
)

// The runner fills two gaps of kumo outside product code: it polls SQS event source mappings
// (kumo records them but never polls) and fires one-time EventBridge Scheduler schedules (kumo
// stores them but never fires them).

// pollWait is the long poll of a mapping's ReceiveMessage; errorBackoff is the pause after a
// failed poll or firing round, so that a broken queue does not spin.
const (
	pollWait     = 2 * time.Second
	errorBackoff = time.Second
	fireInterval = 500 * time.Millisecond
)

// bridges runs the pollers and the schedule firer until stop.
type bridges struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startBridges starts workers pollers per mapping and, if fire, the schedule firer. With a
// callLog directory their calls are logged as made by whom AWS makes them as: a mapping's
// polls by its function's role (Lambda polls with the execution role), a firing by the
// schedule's role.
func startBridges(endpoint string, mappings []mappingSpec, workers int, fire bool, callLog string, quotas *quota.Model, log *slog.Logger) *bridges {
	ctx, cancel := context.WithCancel(context.Background())
	b := &bridges{cancel: cancel}
	cfg := AWSConfig(endpoint)

	sqsClient, lambdaClient := sqs.NewFromConfig(cfg), lambda.NewFromConfig(cfg)

	for _, m := range mappings {
		pollClient := sqsClient
		if callLog != "" {
			pollClient = sqs.NewFromConfig(cfg, func(o *sqs.Options) {
				o.APIOptions = append(o.APIOptions, calllog.New(callLog, m.function).APIOption)
			})
		}

		p := &sqsPoller{m: m, sqs: pollClient, lambda: lambdaClient, log: log.With("function", m.function, "queue", m.queueURL)}

		for range workers {
			b.wg.Go(func() { p.run(ctx) })
		}
	}

	if fire {
		f := newScheduleFirer(scheduler.NewFromConfig(cfg), eventbridge.NewFromConfig(cfg), log)
		if callLog != "" {
			f.calls = calllog.New(callLog, "scheduler")
		}
		if quotas != nil {
			f.invocation = quotas.WaitSchedulerInvocation
		}

		b.wg.Go(func() { f.run(ctx, fireInterval) })
	}

	return b
}

// stop ends the workers and waits for them; an invocation in flight is abandoned, so its
// messages come back after their visibility timeout, as when a Lambda poller stops.
func (b *bridges) stop() {
	b.cancel()
	b.wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}

	return s[:n] + "..."
}
