package eventapi_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/openrelay/capacity/shared/capacity"
)

// The schemas and samples of events/, from this package's directory.
const (
	schemaDir = "../../events/schemas"
	sampleDir = "../../events"
)

// detailTypes are every detail type on the bus: the ones the service accepts and publishes.
var detailTypes = []string{
	capacity.DetailReclaimRequested, capacity.DetailReclaimCompleted, capacity.DetailReclaimRefused,
	capacity.DetailEvictionNotice, capacity.DetailVMTerminated,
	capacity.DetailOperationCompleted, capacity.DetailOperationFailed,
	capacity.DetailTopologyChanged, capacity.DetailTopologyApplied, capacity.DetailTopologyRefused,
}

// inbound are the detail types the service accepts (from other sources); it publishes the rest.
var inbound = capacity.InboundDetailTypes

// kebab is a detail type's schema file name: "Spot VM Eviction Notice" -> spot-vm-eviction-notice.
func kebab(detailType string) string {
	return strings.ToLower(strings.ReplaceAll(detailType, " ", "-"))
}

var (
	schemasOnce sync.Once
	schemas     map[string]*jsonschema.Schema
	schemasErr  error
)

// schemaFor compiles (once) the schema of each detail type.
func schemaFor(t *testing.T, detailType string) *jsonschema.Schema {
	t.Helper()
	schemasOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.AssertFormat() // date-time is checked, not only annotated
		schemas = map[string]*jsonschema.Schema{}
		for _, dt := range detailTypes {
			sch, err := c.Compile(filepath.Join(schemaDir, kebab(dt)+".json"))
			if err != nil {
				schemasErr = err
				return
			}
			schemas[dt] = sch
		}
	})
	if schemasErr != nil {
		t.Fatalf("compile schemas: %v", schemasErr)
	}
	sch, ok := schemas[detailType]
	if !ok {
		t.Fatalf("no schema for detail type %q", detailType)
	}
	return sch
}

// validateDetail checks a detail (JSON) against its detail type's schema.
func validateDetail(t *testing.T, detailType string, detail []byte) error {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(detail))
	if err != nil {
		t.Fatalf("detail of %s is not JSON: %v", detailType, err)
	}
	return schemaFor(t, detailType).Validate(inst)
}

// mustMatchSchema fails the test when an event's detail does not match its schema.
func mustMatchSchema(t *testing.T, e capacity.Event) {
	t.Helper()
	b, err := json.Marshal(e.Detail)
	if err != nil {
		t.Fatalf("encode %s: %v", e.DetailType, err)
	}
	if err := validateDetail(t, e.DetailType, b); err != nil {
		t.Errorf("%s %s does not match its schema: %v\n%s", e.DetailType, e.ID, err, b)
	}
}

// TestSchemaPerDetailType: events/schemas holds one schema per detail type, and nothing else.
func TestSchemaPerDetailType(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(schemaDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, f := range files {
		got = append(got, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	for _, dt := range detailTypes {
		want = append(want, kebab(dt))
		schemaFor(t, dt)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("schemas %v, want %v", got, want)
	}
}

// sample is one sample event of events/bus-*.json.
type sample struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       time.Time       `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

func samples(t *testing.T) map[string]sample {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(sampleDir, "bus-*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no samples in %s: %v", sampleDir, err)
	}
	out := map[string]sample{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s sample
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("%s: not an EventBridge event: %v", f, err)
		}
		out[filepath.Base(f)] = s
	}
	return out
}

// TestSamples: every sample is a whole EventBridge event whose detail matches its detail
// type's schema, every detail type has a sample, and the service's own events come from
// its source.
func TestSamples(t *testing.T) {
	covered := map[string]bool{}
	for name, s := range samples(t) {
		t.Run(name, func(t *testing.T) {
			if s.Version != "0" || s.ID == "" || s.Account == "" || s.Region == "" || s.Time.IsZero() || s.Resources == nil {
				t.Errorf("envelope is incomplete: %+v", s)
			}
			if err := validateDetail(t, s.DetailType, s.Detail); err != nil {
				t.Errorf("detail does not match its schema: %v", err)
			}
			if !slices.Contains(inbound, s.DetailType) && s.Source != capacity.SourceCapacity {
				t.Errorf("source %q, want %q: the service publishes it", s.Source, capacity.SourceCapacity)
			}
			if !strings.HasPrefix(name, "bus-"+kebab(s.DetailType)) {
				t.Errorf("file name %s does not name its detail type %q", name, s.DetailType)
			}
		})
		covered[s.DetailType] = true
	}
	for _, dt := range detailTypes {
		if !covered[dt] {
			t.Errorf("no sample of %q", dt)
		}
	}
}

// TestBadSamplesFail: the schemas refuse what the contract refuses, so a sample or an event
// that drifts from them fails its test.
func TestBadSamplesFail(t *testing.T) {
	all := samples(t)
	tests := []struct {
		name   string
		sample string
		edit   func(d map[string]any)
	}{
		{"unknown member", "bus-capacity-reclaim-requested-operator.json", func(d map[string]any) { d["dryrun"] = true }},
		{"null", "bus-capacity-reclaim-requested-operator.json", func(d map[string]any) { d["reason"] = nil }},
		{"missing actingOrgId", "bus-capacity-reclaim-requested-operator.json", func(d map[string]any) { delete(d, "actingOrgId") }},
		{"wrong type", "bus-capacity-reclaim-requested-operator.json", func(d map[string]any) { d["dryRun"] = "false" }},
		{"grace too long", "bus-capacity-reclaim-requested-operator.json", func(d map[string]any) { d["graceSeconds"] = 121 }},
		{"schedule with extra member", "bus-capacity-reclaim-requested-schedule.json", func(d map[string]any) { d["unitIds"] = []string{"gpu-1"} }},
		{"notice without terminateAfter", "bus-spot-vm-eviction-notice.json", func(d map[string]any) { delete(d, "terminateAfter") }},
		{"notice time not UTC seconds", "bus-spot-vm-eviction-notice.json", func(d map[string]any) { d["terminateAfter"] = "2026-12-02T16:01:01.5+01:00" }},
		{"terminated with agent error", "bus-spot-vm-terminated.json", func(d map[string]any) { d["error"] = "dial tcp 10.0.0.7:443" }},
		{"completed report in failed state", "bus-reclaim-operation-completed.json", func(d map[string]any) { d["state"] = "failed" }},
		{"completed result with unknown member", "bus-capacity-reclaim-completed.json", func(d map[string]any) { d["result"].(map[string]any)["extra"] = 1 }},
		{"refused without code", "bus-capacity-reclaim-refused.json", func(d map[string]any) { delete(d, "code") }},
		{"dry-run plan etag unquoted", "bus-capacity-reclaim-completed.json", func(d map[string]any) {
			d["result"].(map[string]any)["planEtag"] = "0123456789abcdef0123456789abcdef"
		}},
		{"topology change without unitIds", "bus-node-topology-changed.json", func(d map[string]any) { delete(d, "unitIds") }},
		{"topology change with unknown member", "bus-node-topology-changed.json", func(d map[string]any) { d["ifMatch"] = "*" }},
		{"topology change with null reason", "bus-node-topology-changed.json", func(d map[string]any) { d["reason"] = nil }},
		{"topology change with generation 0", "bus-node-topology-changed.json", func(d map[string]any) { d["expectedTopologyGen"] = 0 }},
		{"topology change with generation as text", "bus-node-topology-changed.json", func(d map[string]any) { d["expectedTopologyGen"] = "1" }},
		{"topology change with fractional generation", "bus-node-topology-changed.json", func(d map[string]any) { d["expectedTopologyGen"] = 1.5 }},
		{"topology change with duplicate units", "bus-node-topology-changed.json", func(d map[string]any) { d["unitIds"] = []string{"gpu-0", "gpu-0"} }},
		{"applied without result", "bus-node-topology-applied.json", func(d map[string]any) { delete(d, "result") }},
		{"applied result without needsReview", "bus-node-topology-applied.json", func(d map[string]any) { delete(d["result"].(map[string]any), "needsReview") }},
		{"applied node with unknown member", "bus-node-topology-applied.json", func(d map[string]any) {
			d["result"].(map[string]any)["node"].(map[string]any)["agentKey"] = "c2VjcmV0"
		}},
		{"refused topology without detail", "bus-node-topology-refused.json", func(d map[string]any) { delete(d, "detail") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := all[tt.sample]
			if !ok {
				t.Fatalf("no sample %s", tt.sample)
			}
			if err := validateDetail(t, s.DetailType, s.Detail); err != nil {
				t.Fatalf("the sample itself fails: %v", err)
			}
			var d map[string]any
			if err := json.Unmarshal(s.Detail, &d); err != nil {
				t.Fatal(err)
			}
			tt.edit(d)
			b, _ := json.Marshal(d)
			if err := validateDetail(t, s.DetailType, b); err == nil {
				t.Fatalf("the edited sample passes its schema: %s", b)
			}
		})
	}
}

// TestDomainEventsMatchSchemas: the notices and reports the domain builds match their
// schemas, for an operation in each phase.
func TestDomainEventsMatchSchemas(t *testing.T) {
	created := time.Date(2026, 12, 2, 15, 0, 1, 0, time.UTC)
	base := capacity.Operation{
		ID: "r-1", NodeID: "node-a", ReservationID: "res-1", State: capacity.OpTerminating,
		VMIDs: []string{"vm-1", "vm-2"}, UnitIDs: []string{"gpu-2", "gpu-3"}, Attempt: 1,
		CreatedAt: created, UpdatedAt: created, TerminateAfter: created.Add(time.Minute), OwnerOrgID: "org-owner",
		Victims: []capacity.Victim{
			{VMID: "vm-1", OrgID: "org-buyer", UnitIDs: []string{"gpu-2"}},
			{VMID: "vm-2", OrgID: "org-other", UnitIDs: []string{"gpu-3", "gpu-6"}},
		},
	}
	at := created.Add(2 * time.Minute)
	ended := base
	ended.State, ended.UpdatedAt = capacity.OpFailed, at
	ended.Outcomes = map[string]capacity.VMOutcome{
		"vm-1": {Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1},
		"vm-2": {Outcome: capacity.OutcomeFailed, Error: "gave up", At: at, Attempt: 1},
	}
	completed := base
	completed.Outcomes = map[string]capacity.VMOutcome{
		"vm-1": {Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1},
		"vm-2": {Outcome: capacity.OutcomeAlreadyGone, At: at, Attempt: 1},
	}
	unstarted := base
	unstarted.State, unstarted.Reason = capacity.OpFailed, "the workflow could not be started"

	seen := map[string]bool{}
	for name, evs := range map[string][]capacity.Event{
		"notices":           capacity.EvictionNotices(base),
		"report, failed":    capacity.OperationReport(ended),
		"report, completed": capacity.OperationReport(completed),
		"report, unstarted": capacity.OperationReport(unstarted),
	} {
		if len(evs) == 0 {
			t.Errorf("%s: no events", name)
		}
		for _, e := range evs {
			mustMatchSchema(t, e)
			seen[e.DetailType] = true
		}
	}
	for _, dt := range []string{capacity.DetailEvictionNotice, capacity.DetailVMTerminated, capacity.DetailOperationCompleted, capacity.DetailOperationFailed} {
		if !seen[dt] {
			t.Errorf("no %s was built", dt)
		}
	}
}
