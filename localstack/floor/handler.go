package floor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
)

// Handler serves the floor's route behind API Gateway (a Lambda proxy integration).
type Handler struct {
	DB              *dynamodb.Client
	SFN             *sfn.Client
	StateMachineARN string
	Logger          *slog.Logger
}

// Result is the floor's answer: how many items the Query returned.
type Result struct {
	Items int `json:"items"`
}

// Serve decodes the body and makes the three calls in a reclaim's order: the Query (every
// page, as the store reads them), the TransactWriteItems, StartExecution. It answers 200 with
// a Result, or 500 with what failed (it is a benchmark's tool, deployed only in env local).
func (h *Handler) Serve(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	start := time.Now()
	items, err := h.run(ctx, ev.Body)
	status := http.StatusOK
	body, _ := json.Marshal(Result{Items: items})
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(map[string]string{"error": err.Error()})
		h.Logger.ErrorContext(ctx, "floor call failed", "err", err)
	}
	h.Logger.InfoContext(ctx, "floor", "status", status, "items", items, "duration_ms", time.Since(start).Milliseconds())
	return events.APIGatewayProxyResponse{
		StatusCode: status,
		Headers: map[string]string{
			"Content-Type":  "application/json",
			"Server-Timing": "total;dur=" + strconv.FormatFloat(float64(time.Since(start).Microseconds())/1000, 'f', 3, 64),
		},
		Body: string(body),
	}, nil
}

func (h *Handler) run(ctx context.Context, raw string) (int, error) {
	var req Request
	if err := json.Unmarshal([]byte(raw), &req); err != nil {
		return 0, fmt.Errorf("decode floor request: %w", err)
	}
	q, err := req.Query.Input()
	if err != nil {
		return 0, err
	}
	tx, err := TransactInput(req.Transact)
	if err != nil {
		return 0, err
	}
	items := 0
	for page := dynamodb.NewQueryPaginator(h.DB, q); page.HasMorePages(); {
		out, err := page.NextPage(ctx)
		if err != nil {
			return items, fmt.Errorf("query: %w", err)
		}
		items += len(out.Items)
	}
	if _, err := h.DB.TransactWriteItems(ctx, tx); err != nil {
		return items, fmt.Errorf("transact write items: %w", err)
	}
	_, err = h.SFN.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(h.StateMachineARN), Name: aws.String(req.Start.Name), Input: aws.String(req.Start.Input),
	})
	if err != nil {
		return items, fmt.Errorf("start execution %s: %w", req.Start.Name, err)
	}
	return items, nil
}
