package config

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/calllog"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
)

// readCommon reads the variables every function reads from environ. It fails t unless the
// read fails with an error naming wantErr ("": succeeds), and reports whether it succeeded.
func readCommon(t *testing.T, environ []string, wantErr string) (Common, bool) {
	t.Helper()
	e := envvar.New(envvar.Declare("test", envvar.AppEnv, envvar.LogLevel, envvar.Faults, envvar.FaultsSeed, envvar.CallLog), environ)
	c := ReadCommon(e)
	err := e.Err()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one naming %q", err, wantErr)
		}
		return c, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, true
}

// TestFaultsOnlyAgainstALocalEndpoint: the fault layer is off by default, on only against a
// loopback endpoint, and a function elsewhere refuses to start with it.
func TestFaultsOnlyAgainstALocalEndpoint(t *testing.T) {
	tests := []struct {
		name, faults, endpoint, seed string
		wantOn                       bool
		wantErr                      string
	}{
		{name: "unset is off", endpoint: "http://localhost:4566"},
		{name: "unset is off on AWS"},
		{name: "localhost", faults: "*:Throttling=0.1", endpoint: "http://localhost:4566", wantOn: true},
		{name: "127.0.0.1", faults: "TransactWriteItems:TransactionConflict=0.1", endpoint: "http://127.0.0.1:4566", wantOn: true, seed: "7"},
		{name: "ipv6 loopback", faults: "*:Throttling=0.1", endpoint: "http://[::1]:4566", wantOn: true},
		{name: "api gateway host form", faults: "*:Throttling=0.1", endpoint: "http://abc.execute-api.localhost:4566", wantOn: true},
		{name: "no endpoint: a deployed function", faults: "*:Throttling=0.1", wantErr: "not a loopback address"},
		{name: "remote endpoint", faults: "*:Throttling=0.1", endpoint: "https://dynamodb.us-east-1.amazonaws.com", wantErr: "not a loopback address"},
		{name: "localhost lookalike", faults: "*:Throttling=0.1", endpoint: "http://localhost.example.com", wantErr: "not a loopback address"},
		{name: "bad spec", faults: "*:Boom=0.1", endpoint: "http://localhost:4566", wantErr: "CAPACITY_FAULTS"},
		{name: "bad seed", faults: "*:Throttling=0.1", endpoint: "http://localhost:4566", seed: "x", wantErr: "CAPACITY_FAULTS_SEED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_REGION", "us-east-1")
			c, ok := readCommon(t, []string{"APP_ENV=local", "CAPACITY_FAULTS=" + tc.faults, "AWS_ENDPOINT_URL=" + tc.endpoint,
				"CAPACITY_FAULTS_SEED=" + tc.seed}, tc.wantErr)
			if !ok {
				return
			}
			if on := c.Faults.injector() != nil; on != tc.wantOn {
				t.Fatalf("injector %v, want on %v", on, tc.wantOn)
			}
			cfg, err := AWS(context.Background(), c.Faults)
			if err != nil {
				t.Fatal(err)
			}
			if on := len(cfg.APIOptions) > 0; on != tc.wantOn {
				t.Errorf("clients carry %d API options, want the injector %v", len(cfg.APIOptions), tc.wantOn)
			}
		})
	}
}

// TestCallLogOnlyAgainstALocalEndpoint: the call log is off by default, on only against a
// loopback endpoint and for a named function, where every client logs its calls; a function
// elsewhere refuses to start with it.
func TestCallLogOnlyAgainstALocalEndpoint(t *testing.T) {
	tests := []struct {
		name, dir, endpoint, function string
		wantErr                       string
	}{
		{name: "unset is off", endpoint: "http://localhost:4566", function: "capacity-local-api"},
		{name: "local stack", dir: t.TempDir(), endpoint: "http://localhost:1", function: "capacity-local-api"},
		{name: "no endpoint: a deployed function", dir: t.TempDir(), function: "capacity-prod-api", wantErr: "not a loopback address"},
		{name: "remote endpoint", dir: t.TempDir(), endpoint: "https://dynamodb.us-east-1.amazonaws.com", function: "f", wantErr: "not a loopback address"},
		{name: "no function name", dir: t.TempDir(), endpoint: "http://127.0.0.1:1", wantErr: "AWS_LAMBDA_FUNCTION_NAME"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_REGION", "us-east-1")
			t.Setenv("AWS_ACCESS_KEY_ID", "test")
			t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
			c, ok := readCommon(t, []string{"APP_ENV=local", "CAPACITY_CALL_LOG=" + tc.dir, "AWS_ENDPOINT_URL=" + tc.endpoint,
				"AWS_LAMBDA_FUNCTION_NAME=" + tc.function}, tc.wantErr)
			if !ok {
				return
			}
			cfg := aws.Config{Region: "us-east-1", Credentials: aws.AnonymousCredentials{}, BaseEndpoint: aws.String("http://127.0.0.1:1")}
			c.Calls.install(&cfg)
			if tc.dir == "" {
				if len(cfg.APIOptions) != 0 {
					t.Errorf("clients carry %d API options with the log off", len(cfg.APIOptions))
				}
				return
			}
			// Nothing listens on port 1: the call fails, and is logged all the same.
			db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
			_, _ = db.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String("t")})
			calls, err := calllog.Read(tc.dir)
			want := []calllog.Call{{Principal: tc.function, Service: "DynamoDB", Operation: "DescribeTable", Fields: map[string]string{"TableName": "t"}}}
			if err != nil || !reflect.DeepEqual(calls, want) {
				t.Errorf("logged %+v (%v), want %+v", calls, err, want)
			}
		})
	}
}

// The api function's rate limit: both variables required and checked as cdk.json's are, so a
// function given a broken limit fails its init instead of limiting nothing (or everything).
func TestRateLimit(t *testing.T) {
	tests := []struct {
		name, rate, burst string
		wantErr           string
	}{
		{name: "set", rate: "50", burst: "100"},
		{name: "fractional rate", rate: "0.5", burst: "1"},
		{name: "rate missing", burst: "100", wantErr: "RATE_LIMIT_PER_SECOND must be set"},
		{name: "burst missing", rate: "50", wantErr: "RATE_LIMIT_BURST must be set"},
		{name: "rate not a number", rate: "fast", burst: "1", wantErr: "want a number"},
		{name: "burst not whole", rate: "1", burst: "1.5", wantErr: "want a whole number"},
		{name: "rate zero", rate: "0", burst: "1", wantErr: "perSecond 0"},
		{name: "burst zero", rate: "1", burst: "0", wantErr: "burst 0"},
	}
	fn := envvar.Declare("test", envvar.RateLimitPerSecond, envvar.RateLimitBurst)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := envvar.New(fn, []string{"RATE_LIMIT_PER_SECOND=" + tt.rate, "RATE_LIMIT_BURST=" + tt.burst})
			l := RateLimit(e)
			if err := e.Err(); tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("RateLimit() = %+v, %v; want an error with %q", l, err, tt.wantErr)
				}
				return
			} else if err != nil {
				t.Fatal(err)
			}
			if strconv.FormatFloat(l.PerSecond, 'f', -1, 64) != tt.rate || strconv.Itoa(l.Burst) != tt.burst {
				t.Fatalf("RateLimit() = %+v; want %s/s burst %s", l, tt.rate, tt.burst)
			}
		})
	}
}

// TestTestClientsRetryAsTheFunctions: dynamotest's client (a test kit, which may not import
// this package) makes as many attempts as the functions' clients.
func TestTestClientsRetryAsTheFunctions(t *testing.T) {
	if got := dynamotest.New(t).Client.Options().Retryer.MaxAttempts(); got != SDKMaxAttempts {
		t.Errorf("dynamotest's client makes %d attempts, the functions' %d", got, SDKMaxAttempts)
	}
}
