// Command localstack runs the whole stack on this machine (`make run`): the emulator on
// 127.0.0.1:4566 (or -addr: any free address works, beside another stack too), the stack provisioned from the synthesised template, every function's real
// bootstrap, and demo data. It stops everything on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/localstack/quota"
	"github.com/openrelay/capacity/localstack/stack"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/stackoutput"
)

func main() {
	template := flag.String("template", "cdk.out/local/capacity-local.template.json", "CloudFormation template from `cdk synth -c env=local`")
	outputs := flag.String("outputs", defaultOutputs, "where to write the stack outputs (same shape as cdk deploy --outputs-file); .local/outputs-<port>.json on another -addr")
	addr := flag.String("addr", stack.DefaultAddr, "address of the local endpoint (host:port; the stack's API Gateway, EventBridge and Step Functions invoke its own functions on any port)")
	seed := flag.Bool("seed", true, "write the demo data")
	agentAddr := flag.String("agent-addr", defaultAgentAddr, "address of the node agent simulator (another port of its host when it is taken)")
	flag.Parse()
	outputsSet := false
	flag.Visit(func(f *flag.Flag) { outputsSet = outputsSet || f.Name == "outputs" })
	if !outputsSet {
		*outputs = outputsPath(*addr)
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, *template, *outputs, *addr, *agentAddr, *seed); err != nil {
		logger.Error("local stack failed", "err", err)
		os.Exit(1)
	}
}

const defaultOutputs = ".local/outputs.json"

// defaultAgentAddr is where the agent simulator listens unless told: a fixed port, so that
// the agent URL a user wrote down (and node agent endpoints in their scripts) stay the same
// from run to run.
const defaultAgentAddr = "127.0.0.1:4580"

// outputsPath is where a stack on addr writes its outputs unless told: a second stack on
// another port must not replace the outputs that capacityctl reads for the first.
func outputsPath(addr string) string {
	if addr == stack.DefaultAddr {
		return defaultOutputs
	}
	if _, port, err := net.SplitHostPort(addr); err == nil && port != "" {
		return ".local/outputs-" + port + ".json"
	}
	return defaultOutputs
}

func run(ctx context.Context, logger *slog.Logger, template, outputsPath, addr, agentAddr string, seed bool) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(template); err != nil {
		return fmt.Errorf("no template at %s: run `make synth ENV=local` first (make run does): %w", template, err)
	}
	logger.Info("starting the local stack", "addr", addr, "template", template)
	extra := map[string]string{}
	// The fault layer (shared/awsfault), off unless asked for: `make run FAULTS=...`.
	for _, k := range []string{envvar.Faults.Name(), envvar.FaultsSeed.Name()} {
		if v := os.Getenv(k); v != "" {
			extra[k] = v
			logger.Warn("functions run with injected AWS faults", k, v)
		}
	}
	// AWS's default quotas, scaled (docs/scale.md), off unless asked for: CAPACITY_QUOTA_SCALE=100.
	quotas, err := quota.FromEnv(root)
	if err != nil {
		return err
	}
	st, err := stack.Start(ctx, stack.Options{
		TemplatePath: template, Addr: addr, RepoRoot: root, Logger: logger,
		ExtraEnv: extra, Quotas: quotas,
	})
	if err != nil {
		return fmt.Errorf("start local stack: %w", err)
	}
	defer func() {
		logger.Info("stopping the local stack")
		if err := st.Close(); err != nil {
			logger.Error("stop local stack", "err", err)
		}
	}()
	out := st.Outputs()
	// The demo nodes' agents: a simulator holding the demo VMs, each node's agent with its own
	// key derived from the master secret the stack created (the functions read it at run time).
	master, err := stack.ReadSecret(ctx, st.Endpoint(), out[stackoutput.AgentMasterSecretId])
	if err != nil {
		return fmt.Errorf("read the agent master secret: %w", err)
	}
	agents, err := agentsim.StartOn(agentAddr, agentsim.DerivedKeys(master), logger)
	if err != nil {
		return fmt.Errorf("start node agent simulator: %w", err)
	}
	defer agents.Close()
	if err := writeOutputs(outputsPath, st.StackName(), out, agents.URL()); err != nil {
		return err
	}
	client := dynamodb.NewFromConfig(stack.AWSConfig(st.Endpoint()))
	store := dynamo.New(client, out[stackoutput.StateTableName], out[stackoutput.AuditTableName])
	store.KeysTable = out[stackoutput.KeysTableName]
	// The simulated nodes run the VMs placed through the API, as real nodes do: a reclaim of
	// one ends "terminated", not "already-gone".
	agents.LearnPlacements(store)
	if seed {
		data := demo.Seed(time.Now())
		for i, n := range data.Nodes {
			data.Nodes[i].AgentEndpoint = agents.Endpoint(n.ID)
		}
		if err := store.Put(ctx, data); err != nil {
			return fmt.Errorf("seed demo data: %w", err)
		}
		for _, vm := range data.VMs {
			if err := agents.AddVM(vm.NodeID, vm.ID, string(vm.State)); err != nil {
				return fmt.Errorf("seed demo VM %s on the agent: %w", vm.ID, err)
			}
		}
	}
	printWelcome(out, outputsPath, agents.URL(), seed)
	<-ctx.Done()
	return nil
}

// writeOutputs writes the stack's outputs and the agent simulator's URL (AgentSimulatorUrl),
// which is printed once at start and which a user or script needs again later.
func writeOutputs(path, stackName string, stackOutputs map[string]string, agentURL string) error {
	out := maps.Clone(stackOutputs)
	if out == nil {
		out = map[string]string{}
	}
	out[stackoutput.AgentSimulatorUrl] = agentURL
	return stack.WriteOutputsFile(path, stackName, out)
}

func printWelcome(out map[string]string, outputsPath, agentURL string, seeded bool) {
	api := out[stackoutput.ApiUrl]
	fmt.Printf("\nThe stack is up. Outputs: %s\n  API URL:          %s\n  Agent simulator:  %s\n  State table:      %s\n  Audit table:      %s\n  Keys table:       %s\n\n",
		outputsPath, api, agentURL, out[stackoutput.StateTableName], out[stackoutput.AuditTableName], out[stackoutput.KeysTableName])
	fmt.Print("Every run starts empty: the tables hold only the demo data, and keys, nodes, reservations\n" +
		"and VMs of an earlier run are gone (create them again; a registered node's agent key too).\n" +
		"The two URLs above are the same at every run (the agent's unless its port was taken).\n\n")
	// The web console (docs/console.md): sign in with one of the keys below.
	fmt.Printf("Web console: %s\n\n", strings.TrimSuffix(api, "/")+routes.ConsolePath+"/")
	if seeded {
		fmt.Println("Demo API keys:")
		w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		for _, k := range demo.Keys() {
			fmt.Fprintf(w, "  %s\t%s\torg %s\tpermissions %v\toperator=%v\n", k.Name, k.Secret, k.Key.OrgID, k.Key.Permissions, k.Key.Operator)
		}
		_ = w.Flush()
		fmt.Printf("\nDry-run a reclaim of gpu-2 and gpu-3 as the node owner:\n\n"+
			"  curl -s -X POST '%s/v1/nodes/%s/reservations/%s/reclaim' \\\n"+
			"    -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \\\n"+
			"    -d '{\"unitIds\":[\"gpu-2\",\"gpu-3\"],\"dryRun\":true,\"reason\":\"try it\"}'\n\n",
			api, demo.NodeID, demo.ReservationID, demo.OwnerSecret)
		fmt.Printf("Then reclaim for real (drop \"dryRun\"), follow the operation with the reclaimId it returns,\n"+
			"and ask the node agent simulator what it did:\n\n"+
			"  curl -s '%s/v1/nodes/%s/reservations/%s/reclaims/<reclaimId>' -H 'Authorization: Bearer %s'\n"+
			"  curl -s '%s/_admin/vms?node=%s'\n\n", api, demo.NodeID, demo.ReservationID, demo.OwnerSecret, agentURL, demo.NodeID)
	}
	fmt.Println("Ctrl-C stops everything.")
}
