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
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/calllog"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/trace"
)

// Logger returns a JSON logger at level, also made the default. Every line carries the
// invocation's X-Ray trace id as "trace_id" and, when the ctx has it, the Lambda request id as
// "aws_request_id" (see LogHandler).
func Logger(level slog.Level) *slog.Logger {
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

// Common is what every function reads from its environment (envvar's common variables).
type Common struct {
	AppEnv   string     // the environment's name: the metrics' Environment
	LogLevel slog.Level // of the function's logs
	Faults   Faults     // the AWS faults to inject (local stack only)
	Calls    CallLog    // where to log the AWS calls (local stack only)
}

func (c Common) common() Common { return c }

// Start configures a function at its start: it reads the function's settings with read (whose
// S embeds Common), makes its logger and loads the AWS configuration, and ends the process
// with a logged error on anything wrong in its environment (see envvar).
func Start[S interface{ common() Common }](fn envvar.Function, read func(*envvar.Env) S) (S, *slog.Logger, aws.Config) {
	e := envvar.Load(fn)
	s := read(e)
	logger := Logger(s.common().LogLevel)
	s = Must(s, e.Err())
	cfg := Must(AWS(context.Background(), s.common().Faults))
	s.common().Calls.install(&cfg)
	return s, logger, cfg
}

// ReadCommon reads the variables every function reads; errors go to e.
func ReadCommon(e *envvar.Env) Common {
	c := Common{AppEnv: envvar.AppEnv.Get(e), LogLevel: envvar.LogLevel.Get(e)}
	var err error
	if c.Faults, err = readFaults(e); err != nil {
		e.Fail(err)
	}
	if c.Calls, err = readCallLog(e); err != nil {
		e.Fail(err)
	}
	return c
}

// CallLog logs every AWS call of the function's clients (shared/calllog) to the directory
// CAPACITY_CALL_LOG names, for the local stack's check of the calls against the template's
// IAM policies. The zero CallLog logs nothing.
type CallLog struct{ log *calllog.Log }

// readCallLog reads CAPACITY_CALL_LOG. Like readFaults it refuses unless AWS_ENDPOINT_URL is
// a loopback address: the log belongs to the local stack.
func readCallLog(e *envvar.Env) (CallLog, error) {
	dir := envvar.CallLog.Optional(e)
	endpoint := envvar.EndpointURL.Optional(e)
	function := envvar.FunctionName.Optional(e)
	if dir == "" {
		return CallLog{}, nil
	}
	if err := localOnly(envvar.CallLog, endpoint, "calls are logged"); err != nil {
		return CallLog{}, err
	}
	if function == "" {
		return CallLog{}, fmt.Errorf("%s is set but %s is not: the log names the function that calls", envvar.CallLog.Name(), envvar.FunctionName.Name())
	}
	return CallLog{log: calllog.New(dir, function)}, nil
}

// install adds the log to every client of cfg.
func (c CallLog) install(cfg *aws.Config) {
	if c.log != nil {
		cfg.APIOptions = append(cfg.APIOptions, c.log.APIOption)
	}
}

// AWS loads the SDK configuration. The SDK's standard retryer retries throttling and
// transient faults with backoff (SDKMaxAttempts); condition failures are not retried by it but
// re-decided by the domain. AWS_ENDPOINT_URL (set by the local stack) redirects every client.
// With faults, every client carries the awsfault injector (see Faults).
func AWS(ctx context.Context, faults Faults) (aws.Config, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRetryMode(aws.RetryModeStandard), awsconfig.WithRetryMaxAttempts(SDKMaxAttempts))
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS config: %w", err)
	}
	if inj := faults.injector(); inj != nil {
		cfg.APIOptions = append(cfg.APIOptions, inj.APIOption)
	}
	return cfg, nil
}

// SDKMaxAttempts is how many times an AWS client tries a call (the first and its retries).
const SDKMaxAttempts = 3

// Faults is the fault injection CAPACITY_FAULTS asks for, seeded by CAPACITY_FAULTS_SEED
// (default: the clock). The zero Faults injects none.
type Faults struct {
	spec     string
	rules    []awsfault.Rule
	seed     int64
	endpoint string
}

// readFaults reads CAPACITY_FAULTS and its seed. It refuses unless AWS_ENDPOINT_URL is a
// loopback address: injected faults belong to the local stack and tests, and a deployed
// function (which has no endpoint override) must fail its init rather than run with them.
func readFaults(e *envvar.Env) (Faults, error) {
	spec := envvar.Faults.Optional(e)
	seed, seeded := envvar.FaultsSeed.Get(e)
	endpoint := envvar.EndpointURL.Optional(e)
	if spec == "" {
		return Faults{}, nil
	}
	if err := localOnly(envvar.Faults, endpoint, "fault injection runs"); err != nil {
		return Faults{}, err
	}
	rules, err := awsfault.Parse(spec)
	if err != nil {
		return Faults{}, fmt.Errorf("environment variable %s: %w", envvar.Faults.Name(), err)
	}
	if !seeded {
		seed = time.Now().UnixNano()
	}
	return Faults{spec: spec, rules: rules, seed: seed, endpoint: endpoint}, nil
}

// injector returns the fault injector, nil for none. It logs through the default logger, so
// it is made once the function's logger is.
func (f Faults) injector() *awsfault.Injector {
	if f.spec == "" {
		return nil
	}
	slog.Warn("AWS fault injection is on", "rules", f.spec, "seed", f.seed, "endpoint", f.endpoint)
	inj := awsfault.New(f.seed, f.rules...)
	// One line per fault, so a run can count the faults of every function process.
	inj.Log = slog.Default()
	return inj
}

// localOnly refuses v, which is set, unless the AWS endpoint is a loopback address: what
// belongs to the local stack and tests must fail a deployed function's init (it has no
// endpoint override) rather than run there.
func localOnly(v envvar.Variable, endpoint, what string) error {
	if loopback(endpoint) {
		return nil
	}
	return fmt.Errorf("%s is set but %s %q is not a loopback address: %s only against a local stack",
		v.Name(), envvar.EndpointURL.Name(), endpoint, what)
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

// RateLimit reads the api function's per-key rate limit (RATE_LIMIT_PER_SECOND and
// RATE_LIMIT_BURST, both required), checked as cdk.json's is; errors go to e.
func RateLimit(e *envvar.Env) capacity.RateLimit {
	rate, rateOK := envvar.RateLimitPerSecond.Get(e)
	burst, burstOK := envvar.RateLimitBurst.Get(e)
	l := capacity.RateLimit{PerSecond: rate, Burst: burst}
	if !rateOK || !burstOK {
		return l // the reads' errors say why
	}
	if err := l.Validate(); err != nil {
		e.Fail(fmt.Errorf("environment variables %s and %s: %w", envvar.RateLimitPerSecond.Name(), envvar.RateLimitBurst.Name(), err))
	}
	return l
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
