// Command api is the Lambda behind the REST API: it wires configuration, the DynamoDB store,
// the domain service and the HTTP handler, then serves API Gateway proxy events.
package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/awslabs/aws-lambda-go-api-proxy/core"
	"github.com/awslabs/aws-lambda-go-api-proxy/httpadapter"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/httpapi"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: logLevel(os.Getenv("LOG_LEVEL"))}))
	slog.SetDefault(logger)

	keyTTL, err := time.ParseDuration(envOr("KEY_CACHE_TTL", "30s"))
	if err != nil {
		logger.Error("invalid KEY_CACHE_TTL", "err", err)
		os.Exit(1)
	}
	stateTable, auditTable := os.Getenv("STATE_TABLE"), os.Getenv("AUDIT_TABLE")
	if stateTable == "" || auditTable == "" {
		logger.Error("STATE_TABLE and AUDIT_TABLE must be set")
		os.Exit(1)
	}
	// The SDK's standard retryer retries throttling and transient faults with backoff;
	// condition failures are not retried by it but re-decided by the service.
	cfg, err := config.LoadDefaultConfig(context.Background(),
		config.WithRetryMode(aws.RetryModeStandard), config.WithRetryMaxAttempts(3))
	if err != nil {
		logger.Error("load AWS config", "err", err)
		os.Exit(1)
	}
	store := dynamo.New(dynamodb.NewFromConfig(cfg), stateTable, auditTable)
	lambda.Start(newAdapter(store, keyTTL, logger).ProxyWithContext)
}

// newAdapter wires the store, domain and HTTP API into an API Gateway proxy handler.
func newAdapter(store *dynamo.Store, keyTTL time.Duration, logger *slog.Logger) *httpadapter.HandlerAdapter {
	handler := &httpapi.Handler{
		Service:   &capacity.Service{Store: store, Logger: logger},
		Auth:      &auth.Authenticator{Keys: store, TTL: keyTTL},
		Logger:    logger,
		RequestID: apiGatewayRequestID,
	}
	return httpadapter.New(handler.Mux())
}

// apiGatewayRequestID returns API Gateway's id for the request, so logs, the audit trail and
// API Gateway's own logs share one id.
func apiGatewayRequestID(r *http.Request) string {
	if rc, ok := core.GetAPIGatewayContextFromContext(r.Context()); ok {
		return rc.RequestID
	}
	return ""
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func logLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}
