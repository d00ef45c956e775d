// Package scheduler creates and deletes the one-time EventBridge Scheduler schedules that
// fire scheduled reclaims: each puts a "Capacity Reclaim Requested" event from the schedule
// source onto the capacity bus, so the firing goes through the inbound event path and every
// check runs again.
package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/scheduler"
	"github.com/aws/aws-sdk-go-v2/service/scheduler/types"
	"github.com/aws/smithy-go"

	"github.com/openrelay/capacity/shared/capacity"
)

// atLayout is the one-time schedule expression's time: at(yyyy-mm-ddThh:mm:ss), in UTC.
const atLayout = "2006-01-02T15:04:05"

// Schedules implements capacity.Scheduler on EventBridge Scheduler.
type Schedules struct {
	Client *scheduler.Client
	// Group is the schedule group (SCHEDULE_GROUP).
	Group string
	// RoleARN is the role EventBridge Scheduler assumes to put the event (SCHEDULE_ROLE_ARN).
	RoleARN string
	// BusARN is the capacity bus the event goes to (EVENT_BUS_ARN).
	BusARN string
}

var _ capacity.Scheduler = (*Schedules)(nil)

// Detail is the detail of the event a schedule puts: only what names the scheduled reclaim;
// everything else is read from it when it fires.
type Detail struct {
	NodeID             string `json:"nodeId"`
	ReservationID      string `json:"reservationId"`
	ScheduledReclaimID string `json:"scheduledReclaimId"`
}

// Input returns the CreateSchedule request for sr.
func (s *Schedules) Input(sr capacity.ScheduledReclaim) (*scheduler.CreateScheduleInput, error) {
	detail, err := json.Marshal(Detail{NodeID: sr.NodeID, ReservationID: sr.ReservationID, ScheduledReclaimID: sr.ID})
	if err != nil {
		return nil, fmt.Errorf("encode schedule input of %s: %w", sr.ID, err)
	}
	return &scheduler.CreateScheduleInput{
		Name:                       aws.String(sr.ID),
		GroupName:                  aws.String(s.Group),
		ScheduleExpression:         aws.String("at(" + sr.At.UTC().Format(atLayout) + ")"),
		ScheduleExpressionTimezone: aws.String("UTC"),
		FlexibleTimeWindow:         &types.FlexibleTimeWindow{Mode: types.FlexibleTimeWindowModeOff},
		ActionAfterCompletion:      types.ActionAfterCompletionDelete,
		ClientToken:                aws.String(sr.ID),
		Description:                aws.String("scheduled reclaim of reservation " + sr.ReservationID + " on node " + sr.NodeID),
		Target: &types.Target{
			Arn:     aws.String(s.BusARN),
			RoleArn: aws.String(s.RoleARN),
			EventBridgeParameters: &types.EventBridgeParameters{
				DetailType: aws.String(capacity.DetailReclaimRequested),
				Source:     aws.String(capacity.SourceSchedule),
			},
			Input: aws.String(string(detail)),
		},
	}, nil
}

// Create creates sr's schedule. A ConflictException means a schedule of that name exists:
// names are the scheduled reclaims' unique ids, so it is this one, created by an attempt
// whose answer was lost.
func (s *Schedules) Create(ctx context.Context, sr capacity.ScheduledReclaim) error {
	in, err := s.Input(sr)
	if err != nil {
		return err
	}
	_, err = s.Client.CreateSchedule(ctx, in)
	var conflict *types.ConflictException
	if errors.As(err, &conflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schedule %s: %w", sr.ID, classify(err))
	}
	return nil
}

// Delete deletes sr's schedule; one already gone (fired and deleted after completion, or
// deleted by an attempt whose answer was lost) is success.
func (s *Schedules) Delete(ctx context.Context, sr capacity.ScheduledReclaim) error {
	_, err := s.Client.DeleteSchedule(ctx, &scheduler.DeleteScheduleInput{
		Name: aws.String(sr.ID), GroupName: aws.String(s.Group), ClientToken: aws.String(sr.ID),
	})
	var missing *types.ResourceNotFoundException
	if errors.As(err, &missing) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete schedule %s: %w", sr.ID, classify(err))
	}
	return nil
}

// classify marks throttling that outlasted the SDK's retries as capacity.ErrThrottled: nothing
// was created, and the caller may retry shortly (503 throttled, not 500).
func classify(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == "ThrottlingException" {
		return fmt.Errorf("%w: %w", capacity.ErrThrottled, err)
	}
	return err
}
