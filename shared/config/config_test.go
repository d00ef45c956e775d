package config

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

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
			t.Setenv("CAPACITY_FAULTS", tc.faults)
			t.Setenv("AWS_ENDPOINT_URL", tc.endpoint)
			t.Setenv("CAPACITY_FAULTS_SEED", tc.seed)
			t.Setenv("AWS_REGION", "us-east-1")
			inj, err := Faults()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				if _, err := AWS(context.Background()); err == nil {
					t.Error("AWS() configured clients anyway")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (inj != nil) != tc.wantOn {
				t.Fatalf("injector %v, want on %v", inj, tc.wantOn)
			}
			cfg, err := AWS(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if on := len(cfg.APIOptions) > 0; on != tc.wantOn {
				t.Errorf("clients carry %d API options, want the injector %v", len(cfg.APIOptions), tc.wantOn)
			}
		})
	}
}

// A cap read from the environment: the default when unset, and a clear refusal of anything
// but a whole number above zero (a typo must fail the function's init, not lift the cap).
func TestPositiveInt(t *testing.T) {
	for _, tt := range []struct {
		value string
		want  int
		ok    bool
	}{
		{"", 100, true},
		{"7", 7, true},
		{"0", 0, false},
		{"-3", 0, false},
		{"ten", 0, false},
		{"1.5", 0, false},
	} {
		t.Setenv("CONFIG_TEST_INT", tt.value)
		got, err := PositiveInt("CONFIG_TEST_INT", 100)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("%q: %d, %v; want %d, ok %v", tt.value, got, err, tt.want, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "CONFIG_TEST_INT") {
			t.Errorf("%q: error %v does not name the variable", tt.value, err)
		}
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(RateLimitPerSecondVar, tt.rate)
			t.Setenv(RateLimitBurstVar, tt.burst)
			l, err := RateLimit()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("RateLimit() = %+v, %v; want an error with %q", l, err, tt.wantErr)
				}
				return
			}
			if err != nil || strconv.FormatFloat(l.PerSecond, 'f', -1, 64) != tt.rate || strconv.Itoa(l.Burst) != tt.burst {
				t.Fatalf("RateLimit() = %+v, %v; want %s/s burst %s", l, err, tt.rate, tt.burst)
			}
		})
	}
}
