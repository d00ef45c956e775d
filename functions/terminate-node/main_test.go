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
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/openrelay/capacity/localstack/agentsim"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/agent"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/dynamo/dynamotest"
	"github.com/openrelay/capacity/shared/kmsseal"
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
	agent     agent.NodeAgent // the Agent as main wires it
	store     *dynamo.Store   // the function's store, as main wires it (env.Store is the api's)
	kms       *decrypts       // the function's KMS client
	keyID     string          // the agent keys' KMS key
	masters   agent.MasterSecrets
	reclaimID string
}

// decrypts is a KMS client that counts Decrypt calls.
type decrypts struct {
	kmsseal.API
	n atomic.Int32
}

func (d *decrypts) Decrypt(ctx context.Context, in *kms.DecryptInput, opts ...func(*kms.Options)) (*kms.DecryptOutput, error) {
	d.n.Add(1)
	return d.API.Decrypt(ctx, in, opts...)
}

// instance is the function's agent as a fresh Lambda instance has it: nothing opened yet.
func (f *fixture) instance() agent.NodeAgent {
	return newNodeAgent(f.agent.Client, f.store, kmsseal.New(f.kms, f.keyID), f.masters, quiet)
}

func newFixture(t *testing.T, endpoint func(sim *agentsim.Sim) string) *fixture {
	return newFixtureWith(t, endpoint, nil)
}

// newFixtureWith is newFixture whose demo node is first changed by node, given the sealer
// of the function's KMS key (its agent keys).
func newFixtureWith(t *testing.T, endpoint func(sim *agentsim.Sim) string, node func(n *capacity.Node, sealer *kmsseal.Sealer)) *fixture {
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
	client := &agent.Client{AllowHTTP: true}
	kc := kms.New(kms.Options{Region: "us-east-1", BaseEndpoint: aws.String(env.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	key, err := kc.CreateKey(ctx, &kms.CreateKeyInput{})
	if err != nil {
		t.Fatal(err)
	}
	counted := &decrypts{API: kc}
	sealer := kmsseal.New(counted, aws.ToString(key.KeyMetadata.KeyId))
	masters := secrets.New(sm, aws.ToString(created.ARN))
	store := *env.Store
	nodeAgent := newNodeAgent(client, &store, sealer, masters, quiet)
	data := demo.Seed(time.Now())
	data.Nodes[0].AgentEndpoint = sim.Endpoint(demo.NodeID)
	if endpoint != nil {
		data.Nodes[0].AgentEndpoint = endpoint(sim)
	}
	if node != nil {
		node(&data.Nodes[0], sealer)
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
	return &fixture{env: env, sim: sim, agent: nodeAgent, store: &store, kms: counted, keyID: aws.ToString(key.KeyMetadata.KeyId),
		masters: masters, reclaimID: res.ReclaimID}
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
	term := &capacity.Terminator{Store: env.Store, Agent: f.agent, Logger: quiet}
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
	// Every VM final, the operation still terminating: the workflow's Report step ends it.
	op, err := env.Store.GetOperation(ctx, demo.NodeID, f.reclaimID)
	if err != nil || op.State != capacity.OpTerminating || !op.Ended() || op.ExecutionARN != task.ExecutionARN {
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
	out, err := handler(&capacity.Terminator{Store: f.store, Agent: f.agent, Logger: quiet}, quiet)(ctx, f.task(t))
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
	f.agent.Client.AllowHTTP = false
	out, err := handler(&capacity.Terminator{Store: f.store, Agent: f.agent, Logger: quiet}, quiet)(ctx, f.task(t))
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

// TestNodeKeyGenerations: terminate-node signs with the node's own sealed key, falls back on
// the previous generation only while the agent refuses the new one and only within the
// overlap after a rotation (not once an operator ended it), and never on a key sealed for
// another node.
func TestNodeKeyGenerations(t *testing.T) {
	gen1, gen2 := []byte(strings.Repeat("1", 32)), []byte(strings.Repeat("2", 32))
	seal := func(t *testing.T, s *kmsseal.Sealer, node string, key []byte) []byte {
		sealed, err := s.SealAgentKey(context.Background(), node, key)
		if err != nil {
			t.Fatal(err)
		}
		return sealed
	}
	tests := []struct {
		name string
		node func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer)
		// agentKey is what the operator installed on the agent (nil: the derived key);
		// rotated, when set, is installed with RotateKey on top of it.
		agentKey, rotated []byte
		wantDone          bool
		wantFinal         bool
	}{
		{"generation 1, installed", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey = 1, seal(t, s, n.ID, gen1)
		}, gen1, nil, true, false},
		{"generation 1, agent holds only the derived key", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey = 1, seal(t, s, n.ID, gen1)
		}, nil, nil, false, true},
		{"rotated a minute ago, new key not installed yet: the previous one still works", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, seal(t, s, n.ID, gen2), seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute)
		}, gen1, nil, true, false},
		{"rotated a minute ago and installed", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, seal(t, s, n.ID, gen2), seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute)
		}, gen1, gen2, true, false},
		{"rotated past the overlap, new key never installed: refused for good", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, seal(t, s, n.ID, gen2), seal(t, s, n.ID, gen1), time.Now().Add(-capacity.AgentKeyOverlap-time.Second)
		}, gen1, nil, false, true},
		{"first rotation of a derived key, a minute ago, not installed: the derived key still works", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.AgentKeyRotatedAt = 1, seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute)
		}, nil, nil, true, false},
		{"rotated a minute ago, overlap ended by an operator: the previous key is never used", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, seal(t, s, n.ID, gen2), seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute)
			n.AgentKeyOverlapEndedGen = 2
		}, gen1, nil, false, true},
		{"first rotation of a derived key, overlap ended by an operator: the derived key is never used", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.AgentKeyRotatedAt, n.AgentKeyOverlapEndedGen = 1, seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute), 1
		}, nil, nil, false, true},
		{"overlap of an earlier generation ended, rotated again a minute ago: the previous key works", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey, n.PrevAgentKey, n.AgentKeyRotatedAt = 2, seal(t, s, n.ID, gen2), seal(t, s, n.ID, gen1), time.Now().Add(-time.Minute)
			n.AgentKeyOverlapEndedGen = 1
		}, gen1, nil, true, false},
		{"a key sealed for another node", func(t *testing.T, n *capacity.Node, s *kmsseal.Sealer) {
			n.AgentKeyGen, n.AgentKey = 1, seal(t, s, "node-other", gen1)
		}, gen1, nil, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixtureWith(t, nil, func(n *capacity.Node, s *kmsseal.Sealer) { tc.node(t, n, s) })
			if tc.agentKey != nil {
				if err := f.sim.SetNodeKeys(demo.NodeID, tc.agentKey); err != nil {
					t.Fatal(err)
				}
			}
			if tc.rotated != nil {
				if err := f.sim.RotateNodeKey(demo.NodeID, tc.rotated); err != nil {
					t.Fatal(err)
				}
			}
			out, err := handler(&capacity.Terminator{Store: f.store, Agent: f.agent, Logger: quiet}, quiet)(ctx, f.task(t))
			if err != nil {
				t.Fatal(err)
			}
			if done := slices.Equal(out.Terminated, []string{"vm-spot-1", "vm-spot-2"}); done != tc.wantDone {
				t.Fatalf("output = %+v, want terminated: %v", out, tc.wantDone)
			}
			if state := f.sim.State(demo.NodeID, "vm-spot-1"); (state == agent.StateTerminated) != tc.wantDone {
				t.Errorf("agent's vm-spot-1 is %s", state)
			}
			for _, fl := range out.Failed {
				if fl.Final != tc.wantFinal {
					t.Errorf("failure of %s: final %v (%s), want %v", fl.VMID, fl.Final, fl.Error, tc.wantFinal)
				}
			}
		})
	}
}

// TestReadSettings: the function reads exactly the variables envvar.TerminateNode declares: an
// undeclared read, or a declared one left unread, would fail it at start.
func TestReadSettings(t *testing.T) {
	e := envvar.New(envvar.TerminateNode, []string{"APP_ENV=local", "LOG_LEVEL=info", "STATE_TABLE=s", "AGENT_MASTER_SECRET_ID=m", "AGENT_KEYS_KMS_KEY_ID=k", "AGENT_TIMEOUT=2s", "AGENT_ALLOW_HTTP=true", "HISTORY_RETENTION=2160h"})
	if s := readSettings(e); e.Err() != nil || !s.allowHTTP || s.agentTimeout != 2*time.Second {
		t.Fatalf("settings %+v, error %v", s, e.Err())
	}
}
