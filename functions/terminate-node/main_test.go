package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/stepfn"
)

// TestSampleTask runs events/terminate-node-task.json (with the id of a real reclaim) through
// the wired handler: store on the emulator, signed agent client, agent simulator.
func TestSampleTask(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	secret := []byte("test-secret")
	sim, err := agentsim.Start(secret, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	env := dynamotest.New(t)
	data := demo.Seed(time.Now())
	data.Nodes[0].AgentEndpoint = sim.Endpoint(demo.NodeID)
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

	raw, err := os.ReadFile("../../events/terminate-node-task.json")
	if err != nil {
		t.Fatal(err)
	}
	var task stepfn.Task
	if err := json.Unmarshal(raw, &task); err != nil {
		t.Fatal(err)
	}
	task.ReclaimID = res.ReclaimID
	term := &capacity.Terminator{Store: env.Store, Agent: agentClient{&agent.Client{Secret: secret}}, Logger: quiet}
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
	op, err := env.Store.GetOperation(ctx, demo.NodeID, res.ReclaimID)
	if err != nil || op.State != capacity.OpCompleted || op.ExecutionARN != task.ExecutionARN {
		t.Fatalf("operation = %+v, %v", op, err)
	}
}
