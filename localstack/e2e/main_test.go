// Package e2e tests the deployed stack through API Gateway with real HTTP, asserting on the
// answers and on the tables afterwards. By default it starts the offline local stack from the
// template that `make synth ENV=local` wrote (or the one E2E_TEMPLATE names); with
// CAPACITY_OUTPUTS=<outputs file> it runs against a stack that is already up (`make run`, or
// real LocalStack via cdklocal).
//
// With E2E_FAULTS=<rules> (shared/awsfault's syntax, e.g.
// "TransactionConflict=0.1,Throttling=0.1") the local stack's functions run under the fault
// layer (CAPACITY_FAULTS), and only the tests and benchmarks named UnderFaults run unless
// -run says otherwise: the others assert exact answers that injected faults would change.
// Without it, the UnderFaults tests skip. `make test` and `make bench` run both passes.
//
// After the tests, on the local stack, every AWS call its functions made must be allowed by
// the template's IAM policies (checkIAM): the emulator enforces none.
package e2e

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/quota"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/awsfault"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
)

// Endpoint of the local stack's AWS APIs.
const endpoint = "http://127.0.0.1:4566"

var (
	apiURL  string
	outputs map[string]string
	store   *dynamo.Store
	client  *dynamodb.Client
	agents  *agentsim.Sim // the node agents of every node the tests create
	// masterSecret derives the keys of nodes at key generation 0 (seeded ones).
	masterSecret []byte

	// localStack is the local stack this process started (nil against CAPACITY_OUTPUTS).
	localStack *stack.Stack

	// faultSpec is E2E_FAULTS: the AWS faults the stack's functions run under ("": none).
	faultSpec = strings.TrimSpace(os.Getenv("E2E_FAULTS"))

	// stackQuotas is the quota model the stack runs under (CAPACITY_QUOTA_SCALE, ...; nil: none).
	stackQuotas *quota.Config
)

func TestMain(m *testing.M) {
	flag.Parse()
	if *updateDoc { // writes docs/security.md from authMatrix: no stack needed
		os.Exit(m.Run())
	}
	if testing.Short() {
		shortBenchmarks()
	}
	if err := burstQuotaEnv(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	if quotas, err := quota.FromEnv(filepath.Join("..", "..")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	} else if quotas != nil {
		// The stack meets AWS's quotas (docs/scale.md): only the tests named UnderQuotas
		// hold there unless -run says otherwise.
		stackQuotas = quotas
		if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("UnderQuotas")
		}
	}
	if faultSpec != "" {
		if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("UnderFaults")
		}
		if _, err := awsfault.Parse(faultSpec); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: E2E_FAULTS:", err)
			os.Exit(2)
		}
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	out, stop, err := stackOutputs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer stop()
	// Each simulated node agent holds its own key: a seeded node's is derived from the stack's
	// master secret; a node registered through the API gets the key its answer carried.
	master, err := stack.ReadSecret(context.Background(), endpoint, out["AgentMasterSecretId"])
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	sim, err := agentsim.Start(agentsim.DerivedKeys(master), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start node agent simulator:", err)
		return 1
	}
	defer sim.Close()
	agents, masterSecret = sim, master
	outputs = out
	apiURL = outputs["ApiUrl"]
	client = dynamodb.NewFromConfig(stack.AWSConfig(endpoint), func(o *dynamodb.Options) {
		if stackQuotas != nil {
			// The tests' own seeding and checks meet the quota model too (a burst's nodes share
			// the directory's partition): they retry throttles until through, as they are not
			// what is measured.
			o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts, so.MaxBackoff, so.RateLimiter = 60, 2*time.Second, ratelimit.None
			})
		}
	})
	store = dynamo.New(client, outputs["StateTableName"], outputs["AuditTableName"])
	store.KeysTable = outputs["KeysTableName"]
	// The simulated nodes run every VM placed through the API, as make run's do.
	agents.LearnPlacements(store)
	if err := seedKeys(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: seed API keys:", err)
		return 1
	}
	code := m.Run()
	if localStack != nil {
		// After the stack stopped: every call of every function is in the log.
		stop()
		if err := checkIAM(os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			code = cmp.Or(code, 1)
		}
	}
	return code
}

// stackOutputs reads the outputs of a running stack, or starts the local stack.
func stackOutputs() (map[string]string, func(), error) {
	if path := os.Getenv("CAPACITY_OUTPUTS"); path != "" {
		_, out, err := stack.ReadOutputsFile(path)
		return out, func() {}, err
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, nil, err
	}
	template := filepath.Join(root, "cdk.out/local/capacity-local.template.json")
	if t := os.Getenv("E2E_TEMPLATE"); t != "" { // another synth's output, e.g. cdk synth -o DIR
		template = t
	}
	if _, err := os.Stat(template); err != nil {
		return nil, nil, fmt.Errorf("no template at %s: run `make synth ENV=local` (make test does)", template)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// START_AFTER: the reconciler may start a pending operation after 1 s, not 30 s.
	env := map[string]string{envvar.StartAfter.Name(): "1s"}
	if faultSpec != "" {
		env[envvar.Faults.Name()] = faultSpec
		if seed := os.Getenv("E2E_FAULTS_SEED"); seed != "" {
			env[envvar.FaultsSeed.Name()] = seed
		}
		fmt.Fprintf(os.Stderr, "e2e: the stack's functions run under AWS faults %q\n", faultSpec)
	}
	// E2E_PROCESSES: bootstrap processes per function (their concurrency), 4 unless set.
	processes := 4
	if v := os.Getenv("E2E_PROCESSES"); v != "" {
		if processes, err = strconv.Atoi(v); err != nil || processes < 1 {
			return nil, nil, fmt.Errorf("E2E_PROCESSES=%q: want a positive number", v)
		}
	}
	st, err := stack.Start(context.Background(), stack.Options{
		TemplatePath: template, RepoRoot: root, Processes: processes, Logger: logger, ExtraEnv: env,
		// Every function's AWS calls, for the IAM check after the tests (checkIAM).
		CallLogDir: filepath.Join(root, "build", "local", "calls"),
		Quotas:     stackQuotas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start local stack: %w", err)
	}
	localStack = st
	return st.Outputs(), func() { _ = st.Close() }, nil
}

// seedKeys writes the demo API keys unless a running stack already has them.
func seedKeys() error {
	seed := dynamo.Seed{Keys: demo.Seed(time.Now()).Keys}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := store.Put(ctx, seed)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return nil
	}
	return err
}
