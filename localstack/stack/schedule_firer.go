package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	schedtypes "github.com/aws/aws-sdk-go-v2/service/scheduler/types"

	"github.com/openrelay/capacity/shared/calllog"
)

// scheduleFirer does what EventBridge Scheduler does with a one-time schedule whose target is an
// event bus: when at(...) is due, it puts the target's Input as the event detail, with the
// target's EventBridgeParameters source and detail type, on the bus; then, with
// ActionAfterCompletion DELETE, it deletes the schedule. A failed put is retried on the next
// round (Scheduler retries too), so a firing is delivered at least once.
type scheduleFirer struct {
	scheduler *scheduler.Client
	events    *eventbridge.Client
	log       *slog.Logger
	now       func() time.Time

	// calls, if set, logs each put as made by the schedule's role, as Scheduler makes it.
	calls *calllog.Log

	// invocation, if set, holds each firing until Scheduler's invocation quota lets it
	// through (localstack/quota): Scheduler delays invocations past it.
	invocation func(context.Context)

	fired  map[string]bool // schedule key+version -> put on the bus
	warned map[string]bool // schedule key+version -> told it cannot be fired here
}

func newScheduleFirer(s *scheduler.Client, e *eventbridge.Client, log *slog.Logger) *scheduleFirer {
	return &scheduleFirer{scheduler: s, events: e, log: log, now: time.Now, fired: map[string]bool{}, warned: map[string]bool{}}
}

func (f *scheduleFirer) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()

	for {
		if err := f.tick(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("schedule round failed", "error", err)
		}

		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// tick fires every enabled one-time schedule that is due and not fired yet, in every group.
func (f *scheduleFirer) tick(ctx context.Context) error {
	var errs []error

	pages := scheduler.NewListSchedulesPaginator(f.scheduler, &scheduler.ListSchedulesInput{State: schedtypes.ScheduleStateEnabled})

	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list schedules: %w", err)
		}

		for _, s := range page.Schedules {
			if s.State != schedtypes.ScheduleStateEnabled {
				continue
			}

			if err := f.consider(ctx, aws.ToString(s.GroupName), aws.ToString(s.Name)); err != nil {
				errs = append(errs, err)
			}
		}
	}

	return errors.Join(errs...)
}

func (f *scheduleFirer) consider(ctx context.Context, group, name string) error {
	s, err := f.scheduler.GetSchedule(ctx, &scheduler.GetScheduleInput{Name: aws.String(name), GroupName: aws.String(group)})

	var notFound *schedtypes.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return nil // deleted since the listing
	}

	if err != nil {
		return fmt.Errorf("get schedule %s/%s: %w", group, name, err)
	}

	// An update re-arms a schedule: its expression or modification time is part of the key.
	key := fmt.Sprintf("%s/%s@%s@%d", group, name, aws.ToString(s.ScheduleExpression), aws.ToTime(s.LastModificationDate).UnixNano())

	at, err := parseAt(aws.ToString(s.ScheduleExpression), aws.ToString(s.ScheduleExpressionTimezone))
	if err != nil {
		f.warnOnce(key, "schedule not fired locally: only one-time at(...) schedules are", "schedule", group+"/"+name, "error", err)

		return nil
	}

	if at.After(f.now()) {
		return nil
	}

	if !f.fired[key] {
		if err := f.fire(ctx, s); err != nil {
			var unsupported errUnsupportedTarget
			if errors.As(err, &unsupported) {
				f.warnOnce(key, "schedule not fired locally", "schedule", group+"/"+name, "error", err)

				return nil
			}

			return fmt.Errorf("fire schedule %s/%s: %w", group, name, err)
		}

		f.fired[key] = true
		f.log.Info("fired schedule", "schedule", group+"/"+name, "at", at, "target", aws.ToString(s.Target.Arn))
	}

	if s.ActionAfterCompletion != schedtypes.ActionAfterCompletionDelete {
		return nil
	}

	_, err = f.scheduler.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{Name: aws.String(name), GroupName: aws.String(group)})
	if err != nil && !errors.As(err, &notFound) {
		// Fired already (the key says so); the delete is tried again next round.
		return fmt.Errorf("delete fired schedule %s/%s: %w", group, name, err)
	}

	return nil
}

type errUnsupportedTarget struct{ arn string }

func (e errUnsupportedTarget) Error() string {
	return "the local stack fires schedules only at event bus targets, not " + e.arn
}

// fire puts the schedule's event on its target bus.
func (f *scheduleFirer) fire(ctx context.Context, s *scheduler.GetScheduleOutput) error {
	t := s.Target
	if t == nil || !strings.Contains(aws.ToString(t.Arn), ":event-bus/") || t.EventBridgeParameters == nil {
		arn := ""
		if t != nil {
			arn = aws.ToString(t.Arn)
		}

		return errUnsupportedTarget{arn: arn}
	}

	if f.invocation != nil {
		f.invocation(ctx)
	}

	detail := valueOr(aws.ToString(t.Input), "{}")

	in := &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		// kumo matches rules on the bus name only; AWS takes the name or the ARN.
		EventBusName: aws.String(eventBusName(aws.ToString(t.Arn))),
		Source:       t.EventBridgeParameters.Source,
		DetailType:   t.EventBridgeParameters.DetailType,
		Detail:       aws.String(detail),
		Time:         aws.Time(f.now()),
	}}}
	if f.calls != nil {
		call := calllog.Call{Principal: aws.ToString(t.RoleArn), Service: "EventBridge", Operation: "PutEvents", Fields: calllog.Fields(in)}
		if err := f.calls.Write(call); err != nil {
			return err
		}
	}

	out, err := f.events.PutEvents(ctx, in)
	if err != nil {
		return fmt.Errorf("put event: %w", err)
	}

	if out.FailedEntryCount > 0 {
		code, msg := "", ""
		if len(out.Entries) > 0 {
			code, msg = aws.ToString(out.Entries[0].ErrorCode), aws.ToString(out.Entries[0].ErrorMessage)
		}

		return fmt.Errorf("put event: entry failed: %s %s", code, msg)
	}

	return nil
}

func (f *scheduleFirer) warnOnce(key, msg string, args ...any) {
	if f.warned[key] {
		return
	}

	f.warned[key] = true
	f.log.Warn(msg, args...)
}

// parseAt reads a one-time schedule expression, at(yyyy-mm-ddThh:mm:ss), in its time zone
// (UTC when none is given).
func parseAt(expr, tz string) (time.Time, error) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(expr), "at(")
	if !ok {
		return time.Time{}, fmt.Errorf("expression %q is not at(...)", expr)
	}

	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return time.Time{}, fmt.Errorf("expression %q is not at(...)", expr)
	}

	loc := time.UTC

	if tz != "" && tz != "UTC" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return time.Time{}, fmt.Errorf("time zone %q: %w", tz, err)
		}

		loc = l
	}

	at, err := time.ParseInLocation("2006-01-02T15:04:05", inner, loc)
	if err != nil {
		return time.Time{}, fmt.Errorf("expression %q: %w", expr, err)
	}

	return at, nil
}
