package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/secrets"
	"github.com/openrelay/capacity/shared/stepfn"
)

var quiet = slog.New(slog.NewJSONHandler(io.Discard, nil))

// fixture is the wiring of main on the emulator: the store, the agent master secret in Secrets
// Manager, the client deriving node keys from it, and an agent simulator whose node agents hold
// their own derived keys, with the demo data and one reclaim of gpu-2 and gpu-3 committed.
type fixture struct {
	env       *dynamotest.Env
	sim       *agentsim.Sim
	client    *agent.Client
	reclaimID string
}

func newFixture(t *testing.T, endpoint func(sim *agentsim.Sim) string) *fixture {
	t.Helper()
	ctx := context.Background()
	env := dynamotest.New(t)
	sm := secretsmanager.New(secretsmanager.Options{Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	master := []byte(strings.Repeat("m", 40))
	created, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String("capacity/test/agent-master-" + capacity.NewID()), SecretString: aws.String(string(master))})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := agentsim.Start(agentsim.DerivedKeys(master), quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	// As main wires it, with the local stack's plain-http allowance.
	client := &agent.Client{Keys: agent.Derived{Masters: secrets.New(sm, aws.ToString(created.ARN))}, AllowHTTP: true}
	data := demo.Seed(time.Now())
	data.Nodes[0].AgentEndpoint = sim.Endpoint(demo.NodeID)
	if endpoint != nil {
		data.Nodes[0].AgentEndpoint = endpoint(sim)
	}
	if err := env.Store.Put(ctx, data); err != nil {
		t.Fatal(err)
	}
	for _, vm := range data.VMs {
		if err := sim.AddVM(vm.NodeID, vm.ID, string(vm.State)); err != nil {
			t.Fatal(err)
		}
	}
	owner := capacity.Principal{OrgID: demo.OrgOwner, Permissions: []string{capacity.PermCapacity}}
	res, err := (&capacity.Service{Store: env.Store, Logger: quiet}).Reclaim(ctx, owner,
		capacity.CapacityRequest{NodeID: demo.NodeID, ReservationID: demo.ReservationID, UnitIDs: []string{"gpu-2", "gpu-3"}}, capacity.RequestMeta{})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{env: env, sim: sim, client: client, reclaimID: res.ReclaimID}
}

// task is events/terminate-node-task.json for the fixture's reclaim.
func (f *fixture) task(t *testing.T) stepfn.Task {
	t.Helper()
	raw, err := os.ReadFile("../../events/terminate-node-task.json")
	if err != nil {
		t.Fatal(err)
	}
	var task stepfn.Task
	if err := json.Unmarshal(raw, &task); err != nil {
		t.Fatal(err)
	}
	task.ReclaimID = f.reclaimID
	return task
}

// TestSampleTask runs events/terminate-node-task.json (with the id of a real reclaim) through
// the wired handler: store on the emulator, master secret read from the emulator's Secrets
// Manager, signed agent client, agent simulator.
func TestSampleTask(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, nil)
	env, sim, task := f.env, f.sim, f.task(t)
	term := &capacity.Terminator{Store: env.Store, Agent: nodeAgent{f.client}, Logger: quiet}
	out, err := handler(term, quiet)(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Done || out.Round != 1 || !slices.Equal(out.Terminated, []string{"vm-spot-1", "vm-spot-2"}) || len(out.VMIDs) != 0 {
		t.Fatalf("output = %+v", out)
	}
	if sim.State(demo.NodeID, "vm-spot-1") != "terminated" || sim.State(demo.NodeID, "vm-res-1") != "running" {
		t.Error("the agent did not terminate exactly the victims")
	}
	op, err := env.Store.GetOperation(ctx, demo.NodeID, f.reclaimID)
	if err != nil || op.State != capacity.OpCompleted || op.ExecutionARN != task.ExecutionARN {
		t.Fatalf("operation = %+v, %v", op, err)
	}
}

// TestForgedAnswersAreNotTakenAsDone: something between the function and the node (a proxy,
// a spoofed endpoint) answers "terminated" without the agent's signature. The VMs are not
// marked terminated, keep their units, and are retried next round; the real agent still has
// them running.
func TestForgedAnswersAreNotTakenAsDone(t *testing.T) {
	ctx := context.Background()
	forger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vm := path.Base(strings.TrimSuffix(r.URL.Path, "/terminate"))
		agent.WriteJSON(w, http.StatusOK, agent.TerminateResponse{VMID: vm, State: agent.StateTerminated})
	}))
	t.Cleanup(forger.Close)
	f := newFixture(t, func(*agentsim.Sim) string { return forger.URL + "/" + demo.NodeID })
	out, err := handler(&capacity.Terminator{Store: f.env.Store, Agent: nodeAgent{f.client}, Logger: quiet}, quiet)(ctx, f.task(t))
	if err != nil {
		t.Fatal(err)
	}
	if out.Done || len(out.Terminated)+len(out.AlreadyGone) != 0 || !slices.Equal(out.VMIDs, []string{"vm-spot-1", "vm-spot-2"}) {
		t.Fatalf("output = %+v, want both VMs to retry and none done", out)
	}
	for _, fl := range out.Failed {
		if fl.Final {
			t.Errorf("failure of %s is final: %s", fl.VMID, fl.Error)
		}
	}
	node, err := f.env.Store.LoadNode(ctx, demo.NodeID, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range node.VMs {
		if (vm.ID == "vm-spot-1" || vm.ID == "vm-spot-2") && vm.State != capacity.VMTerminating {
			t.Errorf("%s is %s after a forged answer, want terminating", vm.ID, vm.State)
		}
	}
	if f.sim.State(demo.NodeID, "vm-spot-1") != agent.StateRunning {
		t.Error("the real agent's VM is not running")
	}
}

// TestPlainHTTPEndpointRefusedOutsideLocal: without AGENT_ALLOW_HTTP an http:// endpoint is a
// final failure, and nothing is sent to it.
func TestPlainHTTPEndpointRefusedOutsideLocal(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, nil)
	f.client.AllowHTTP = false
	out, err := handler(&capacity.Terminator{Store: f.env.Store, Agent: nodeAgent{f.client}, Logger: quiet}, quiet)(ctx, f.task(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Failed) != 2 || len(out.Terminated) != 0 {
		t.Fatalf("output = %+v, want both VMs failed", out)
	}
	for _, fl := range out.Failed {
		if !fl.Final || !strings.Contains(fl.Error, "https") {
			t.Errorf("failure of %s: final %v, %q; want final, naming https", fl.VMID, fl.Final, fl.Error)
		}
	}
	if n := f.sim.TerminateCalls(demo.NodeID, "vm-spot-1"); n != 0 {
		t.Errorf("%d calls reached the agent over http", n)
	}
}

func TestAllowHTTP(t *testing.T) {
	for _, tc := range []struct {
		in, appEnv string
		want       bool
		wantErr    bool
	}{
		{"", "prod", false, false}, {"false", "prod", false, false}, {"", "local", false, false},
		{"true", "local", true, false},
		{"true", "prod", false, true}, {"true", "dev", false, true}, {"true", "", false, true},
		{"TRUE", "local", false, true}, {"1", "local", false, true}, {"yes", "local", false, true},
	} {
		got, err := allowHTTP(tc.in, tc.appEnv)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("allowHTTP(%q, env %q) = %v, %v; want %v, error %v", tc.in, tc.appEnv, got, err, tc.want, tc.wantErr)
		}
	}
}
