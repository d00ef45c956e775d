package capacity

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Reclaim list filters (the state query of a reservation's reclaims): the operation states
// each names.
var reclaimStateFilters = map[string][]OperationState{
	"in-flight": {OpPendingStart, OpTerminating},
	"failed":    {OpFailed},
	"completed": {OpCompleted},
}

// ReclaimFilters are the values of the reclaim list's state filter.
var ReclaimFilters = []string{"in-flight", "failed", "completed"}

// OperationPage is one page of a reservation's reclaim operations, newest first.
type OperationPage struct {
	Reclaims   []OperationView
	NextCursor string
}

// ListReclaimOperations returns a page of the reservation's reclaim operations, newest first,
// to a caller who may see the reservation (as GetOperation: whole to an operator, the owner
// or a managing org, redacted to the audience), optionally only those in-flight, failed or
// completed. The cursor names the last operation shown. Operations committed before the list
// index existed are not listed until the migration indexes them (docs/compatibility.md).
func (s *Service) ListReclaimOperations(ctx context.Context, p Principal, nodeID, reservationID, state string, page PageRequest) (*OperationPage, error) {
	_, access, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	var states []OperationState
	if state != "" {
		var ok bool
		if states, ok = reclaimStateFilters[state]; !ok {
			return nil, Errorf(CodeInvalidRequest, "state must be one of in-flight, failed, completed")
		}
	}
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	var before *OperationPosition
	if parts, err := parseCursor(page.Cursor, "reclaims", 4); err != nil {
		return nil, err
	} else if parts != nil {
		at, terr := time.Parse(time.RFC3339Nano, parts[2])
		if parts[0] != nodeID || parts[1] != reservationID || terr != nil || !ValidID(parts[3]) {
			return nil, Errorf(CodeInvalidRequest, "invalid cursor")
		}
		before = &OperationPosition{CreatedAt: at, ID: parts[3]}
	}
	dir, ok := s.Store.(NodeDirectory)
	if !ok {
		return nil, fmt.Errorf("store %T does not implement the node directory", s.Store)
	}
	start := time.Now()
	ops, more, err := dir.ReservationOperations(ctx, nodeID, reservationID, states, before, limit)
	CallStatsFrom(ctx).Since(PhaseRead, start)
	if err != nil {
		if e := (*Error)(nil); errors.As(err, &e) {
			return nil, err
		}
		return nil, fmt.Errorf("list reclaim operations of reservation %s: %w", reservationID, err)
	}
	out := &OperationPage{Reclaims: make([]OperationView, 0, len(ops))}
	for _, op := range ops {
		if access == AccessManage {
			out.Reclaims = append(out.Reclaims, OperationView{Operation: op})
		} else {
			out.Reclaims = append(out.Reclaims, *op.redacted())
		}
	}
	if more && len(ops) > 0 {
		last := ops[len(ops)-1]
		out.NextCursor = listCursor("reclaims", nodeID, reservationID, last.CreatedAt.UTC().Format(time.RFC3339Nano), last.ID)
	}
	return out, nil
}
