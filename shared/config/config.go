// Package config reads a function's configuration from its environment and builds what every
// function needs: a JSON logger and AWS SDK configuration.
package config

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
)

// Logger returns a JSON logger at LOG_LEVEL (default info), also made the default.
func Logger() *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("LOG_LEVEL"))); err != nil {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(logger)
	return logger
}

// AWS loads the SDK configuration. The SDK's standard retryer retries throttling and
// transient faults with backoff; condition failures are not retried by it but re-decided
// by the domain. AWS_ENDPOINT_URL (set by the local stack) redirects every client.
func AWS(ctx context.Context) (aws.Config, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRetryMode(aws.RetryModeStandard), awsconfig.WithRetryMaxAttempts(3))
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS config: %w", err)
	}
	return cfg, nil
}

// Required returns the values of environment variables that must be set.
func Required(names ...string) (map[string]string, error) {
	out := make(map[string]string, len(names))
	for _, n := range names {
		v := os.Getenv(n)
		if v == "" {
			return nil, fmt.Errorf("environment variable %s must be set", n)
		}
		out[n] = v
	}
	return out, nil
}

// Duration reads a duration variable, with a default when unset.
func Duration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("environment variable %s: %w", name, err)
	}
	return d, nil
}

// Must ends the process with a logged error: a function that cannot configure itself must
// fail its init, which Lambda reports, rather than serve wrongly.
func Must[T any](v T, err error) T {
	if err != nil {
		slog.Error("configuration", "err", err)
		os.Exit(1)
	}
	return v
}
