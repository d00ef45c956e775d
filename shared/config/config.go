// Package config reads a function's configuration from its environment and builds what every
// function needs: a JSON logger and AWS SDK configuration.
package config

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/trace"
)

// Logger returns a JSON logger at LOG_LEVEL (default info), also made the default. Every
// line carries the invocation's X-Ray trace id as "trace_id" and, when the ctx has it, the
// Lambda request id as "aws_request_id" (see LogHandler).
func Logger() *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("LOG_LEVEL"))); err != nil {
		level = slog.LevelInfo
	}
	logger := slog.New(LogHandler(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: level})))
	slog.SetDefault(logger)
	return logger
}

// LogHandler wraps h so that every record names its invocation: "trace_id", the Root of the
// X-Ray trace header (the ctx's, else the environment's, which is the invocation being
// served even for a call without ctx), to go from a trace to its logs and back; and
// "aws_request_id", the Lambda request id, when the ctx carries the Lambda context.
func LogHandler(h slog.Handler) slog.Handler { return invocationHandler{h} }

type invocationHandler struct{ slog.Handler }

func (h invocationHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if id := trace.ID(ctx); id != "" {
		r.AddAttrs(slog.String("trace_id", id))
	}
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		r.AddAttrs(slog.String("aws_request_id", lc.AwsRequestID))
	}
	return h.Handler.Handle(ctx, r)
}

func (h invocationHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return invocationHandler{h.Handler.WithAttrs(attrs)}
}

func (h invocationHandler) WithGroup(name string) slog.Handler {
	return invocationHandler{h.Handler.WithGroup(name)}
}

// AWS loads the SDK configuration. The SDK's standard retryer retries throttling and
// transient faults with backoff; condition failures are not retried by it but re-decided
// by the domain. AWS_ENDPOINT_URL (set by the local stack) redirects every client.
//
// CAPACITY_FAULTS (local stack only) installs the awsfault injector with its rules on every
// client, seeded by CAPACITY_FAULTS_SEED (default: the clock); see Faults.
func AWS(ctx context.Context) (aws.Config, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRetryMode(aws.RetryModeStandard), awsconfig.WithRetryMaxAttempts(3))
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS config: %w", err)
	}
	inj, err := Faults()
	if err != nil {
		return aws.Config{}, err
	}
	if inj != nil {
		cfg.APIOptions = append(cfg.APIOptions, inj.APIOption)
	}
	return cfg, nil
}

// Faults returns the fault injector CAPACITY_FAULTS asks for, or nil when it is unset. It
// refuses unless AWS_ENDPOINT_URL is a loopback address: injected faults belong to the local
// stack and tests, and a deployed function (which has no endpoint override) must fail its
// init rather than run with them.
func Faults() (*awsfault.Injector, error) {
	spec := os.Getenv("CAPACITY_FAULTS")
	if spec == "" {
		return nil, nil
	}
	endpoint := os.Getenv("AWS_ENDPOINT_URL")
	if !loopback(endpoint) {
		return nil, fmt.Errorf("CAPACITY_FAULTS is set but AWS_ENDPOINT_URL %q is not a loopback address: fault injection runs only against a local stack", endpoint)
	}
	rules, err := awsfault.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("environment variable CAPACITY_FAULTS: %w", err)
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("CAPACITY_FAULTS_SEED"); v != "" {
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("environment variable CAPACITY_FAULTS_SEED: %w", err)
		}
	}
	slog.Warn("AWS fault injection is on", "rules", spec, "seed", seed, "endpoint", endpoint)
	inj := awsfault.New(seed, rules...)
	// One line per fault, so a run can count the faults of every function process.
	inj.Log = slog.Default()
	return inj, nil
}

// loopback reports whether an endpoint URL names this machine.
func loopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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

// PositiveInt reads a whole number above zero, with a default when unset.
func PositiveInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("environment variable %s: %q, want a whole number above 0", name, v)
	}
	return n, nil
}

// Environment variables of the per-key rate limit (the api function's; infra sets them from
// cdk.json rateLimit).
const (
	RateLimitPerSecondVar = "RATE_LIMIT_PER_SECOND"
	RateLimitBurstVar     = "RATE_LIMIT_BURST"
)

// RateLimit reads the per-key rate limit: RATE_LIMIT_PER_SECOND (a number above 0) and
// RATE_LIMIT_BURST (a whole number), both required and checked as cdk.json's are.
func RateLimit() (capacity.RateLimit, error) {
	vals, err := Required(RateLimitPerSecondVar, RateLimitBurstVar)
	if err != nil {
		return capacity.RateLimit{}, err
	}
	rate, err := strconv.ParseFloat(vals[RateLimitPerSecondVar], 64)
	if err != nil {
		return capacity.RateLimit{}, fmt.Errorf("environment variable %s: %q, want a number", RateLimitPerSecondVar, vals[RateLimitPerSecondVar])
	}
	burst, err := strconv.Atoi(vals[RateLimitBurstVar])
	if err != nil {
		return capacity.RateLimit{}, fmt.Errorf("environment variable %s: %q, want a whole number", RateLimitBurstVar, vals[RateLimitBurstVar])
	}
	l := capacity.RateLimit{PerSecond: rate, Burst: burst}
	if err := l.Validate(); err != nil {
		return capacity.RateLimit{}, fmt.Errorf("environment variables %s and %s: %w", RateLimitPerSecondVar, RateLimitBurstVar, err)
	}
	return l, nil
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
