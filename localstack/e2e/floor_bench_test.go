package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/floor"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/stepfn"
)

// floorPath is the floor's route for a node (infra.FloorRoute, env local only).
func floorPath(node string) string {
	return "/v1/_floor/nodes/" + node + "/reservations/" + demo.ReservationID + "/reclaim"
}

// queryCapture records the first QueryInput a client sends.
type queryCapture struct {
	mu sync.Mutex
	in *dynamodb.QueryInput
}

func (c *queryCapture) option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("bench.CaptureQuery",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if q, ok := in.Parameters.(*dynamodb.QueryInput); ok {
					c.mu.Lock()
					if c.in == nil {
						cp := *q
						c.in = &cp
					}
					c.mu.Unlock()
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	})
}

// floorRequest precomputes, for a reclaim of gpu-2 and gpu-3 by the owner on node, the floor's
// three calls from the product's own code: the Query the store's LoadNode sends (captured as
// it goes out, so it is the same key condition and filter whatever the layout), the
// TransactWriteItems the store would send for the commit the plan makes, and the
// StartExecution the workflow would make.
func floorRequest(tb testing.TB, node string) floor.Request {
	tb.Helper()
	ctx := context.Background()
	var capture queryCapture
	capturing := *store
	capturing.Client = dynamodb.New(store.Client.Options(), capture.option)
	st, err := capturing.LoadNode(ctx, node, "")
	if err != nil {
		tb.Fatal(err)
	}
	owner := capacity.Principal{KeyID: "bench", OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	req := capacity.CapacityRequest{NodeID: node, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3"}, Reason: "bench"}
	plan, err := capacity.DecideReclaim(owner, st, req, time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	audit := capacity.AuditRecord{
		ID: capacity.NewID(), Time: now, ActorKeyID: owner.KeyID, CallerOrgID: owner.OrgID, ActingFor: st.Node.OwnerOrgID,
		Action: capacity.ActionReclaim, NodeID: node, ReservationID: req.ReservationID, UnitIDs: req.UnitIDs,
		Reason: req.Reason, TopologyGen: st.Node.TopologyGen,
	}
	c, _, _ := plan.Commit("rcl_"+capacity.NewID(), audit, now)
	if c == nil || c.Operation == nil {
		tb.Fatalf("reclaim on %s evicts nothing", node)
	}
	return encodeFloor(tb, store, capture.in, c)
}

func encodeFloor(tb testing.TB, s *dynamo.Store, q *dynamodb.QueryInput, c *capacity.Commit) floor.Request {
	tb.Helper()
	if q == nil {
		tb.Fatal("LoadNode sent no Query")
	}
	query, err := floor.QueryOf(q)
	if err != nil {
		tb.Fatal(err)
	}
	tx, err := s.TransactInput(*c)
	if err != nil {
		tb.Fatal(err)
	}
	actions, err := floor.TransactOf(tx)
	if err != nil {
		tb.Fatal(err)
	}
	input, err := json.Marshal(stepfn.InputOf(*c.Operation, time.Now()))
	if err != nil {
		tb.Fatal(err)
	}
	return floor.Request{Query: query, Transact: actions, Start: floor.Start{Name: capacity.ExecutionName(*c.Operation), Input: string(input)}}
}

// serverTimingDurations returns the dur of each metric of a Server-Timing header, in ms.
func serverTimingDurations(h string) map[string]float64 {
	out := map[string]float64{}
	for _, metric := range strings.Split(h, ",") {
		params := strings.Split(strings.TrimSpace(metric), ";")
		for _, p := range params[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if d, err := strconv.ParseFloat(v, 64); err == nil {
					out[params[0]] = d
				}
			}
		}
	}
	return out
}
