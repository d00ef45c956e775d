package main

// Assertion tests on the synthesised template. They walk the template JSON in Go instead of
// using assertions.Template matchers, because a failed CDK assertion panics rather than fails.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/openrelay/capacity/shared/config/envvar"
)

// testAssetRoot holds a dummy <fn>/bootstrap per function so that synth does not need `make lambdas`.
var testAssetRoot string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "capacity-infra-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, f := range envvar.Functions {
			fn := f.Name()
			if err := os.MkdirAll(filepath.Join(dir, fn), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if err := os.WriteFile(filepath.Join(dir, fn, "bootstrap"), []byte("dummy"), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		testAssetRoot = dir
		return m.Run()
	}()
	jsii.Close()
	os.Exit(code)
}

// cdkJSONContext is the context of ../cdk.json (feature flags...), so that the tests
// synthesise what `cdk synth` does.
func cdkJSONContext(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("../cdk.json")
	if err != nil {
		t.Fatalf("read cdk.json: %v", err)
	}
	var c struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("cdk.json: %v", err)
	}
	return c.Context
}

type tmpl map[string]any

var synthCache = map[string]tmpl{}

// synth returns the template of the stack for env (synthesised once per env).
func synth(t *testing.T, env string) tmpl {
	t.Helper()
	if tp, ok := synthCache[env]; ok {
		return tp
	}
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	props := CapacityStackProps{Env: env, AssetRoot: testAssetRoot}
	// The environment's break-glass role, as cdk.json gives it (the rest of its settings
	// would tie the stack to an account).
	if p, err := StackPropsFor(ctx[EnvironmentsContextKey], env); err == nil {
		props.AgentKeysBreakGlassRole = p.AgentKeysBreakGlassRole
	}
	s, err := NewCapacityStack(app, props)
	if err != nil {
		t.Fatalf("NewCapacityStack(%q): %v", env, err)
	}
	if got := *s.StackName(); got != "capacity-"+env {
		t.Errorf("stack name %q, want capacity-%s", got, env)
	}
	if !*awscdk.Token_IsUnresolved(s.Account()) || !*awscdk.Token_IsUnresolved(s.Region()) {
		t.Errorf("stack is not environment-agnostic: account %s region %s", *s.Account(), *s.Region())
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	synthCache[env] = tp
	return tp
}

// resources returns the template's resources of a type, by logical id.
func (tp tmpl) resources(typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range tp["Resources"].(map[string]any) {
		if r := r.(map[string]any); r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// one returns the single resource of a type whose property prop equals value.
func (tp tmpl) one(t *testing.T, typ, prop string, value any) (string, map[string]any) {
	t.Helper()
	var ids []string
	var found map[string]any
	for id, r := range tp.resources(typ) {
		if reflect.DeepEqual(props(r)[prop], value) {
			ids = append(ids, id)
			found = r
		}
	}
	if len(ids) != 1 {
		t.Fatalf("want one %s with %s=%v, found %v", typ, prop, value, ids)
	}
	return ids[0], found
}

func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

func ref(id string) any          { return map[string]any{"Ref": id} }
func getAtt(id, attr string) any { return map[string]any{"Fn::GetAtt": []any{id, attr}} }

// asList normalises a policy Action/Resource (a value or a list) to a list.
func asList(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func functionByName(t *testing.T, tp tmpl, env, name string) (string, map[string]any) {
	t.Helper()
	return tp.one(t, "AWS::Lambda::Function", "FunctionName", "capacity-"+env+"-"+name)
}

func stateMachineID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
	return id
}

func logGroupID(t *testing.T, tp tmpl, name string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::Logs::LogGroup", "LogGroupName", name)
	return id
}

func TestValidateEnv(t *testing.T) {
	for _, tc := range []struct {
		env string
		ok  bool
	}{
		{"local", true}, {"dev", true}, {"prod", true}, {"pr-42", true}, {"ab", true},
		{"abcdefghijklmnop", true}, // 16 characters
		{"", false}, {"a", false}, {"Prod", false}, {"dev_1", false}, {"-dev", false},
		{"1dev", false}, {"dev.x", false}, {"dev x", false}, {"abcdefghijklmnopq", false},
	} {
		err := ValidateEnv(tc.env)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateEnv(%q) = %v, want ok=%v", tc.env, err, tc.ok)
		}
	}
}

func TestInvalidEnvIsRejected(t *testing.T) {
	for _, env := range []string{"Prod", "x", "dev_1", "../etc"} {
		app := awscdk.NewApp(nil)
		s, err := NewCapacityStack(app, CapacityStackProps{Env: env, AssetRoot: testAssetRoot})
		if err == nil || s != nil {
			t.Errorf("NewCapacityStack(%q) = %v, %v: want an error", env, s, err)
		}
		if n := len(*app.Node().Children()); n != 0 {
			t.Errorf("NewCapacityStack(%q) left %d constructs in the app", env, n)
		}
	}
}

func TestAgentMasterSecretByARNIsRejected(t *testing.T) {
	app := awscdk.NewApp(nil)
	arn := "arn:aws:secretsmanager:us-east-1:123456789012:secret:capacity/prod/agent-master-AbCdEf"
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "prod", AssetRoot: testAssetRoot, AgentMasterSecretName: arn})
	if err == nil || s != nil || !strings.Contains(err.Error(), "not its ARN") {
		t.Fatalf("NewCapacityStack with a secret ARN = %v, %v: want a clear error", s, err)
	}
}

func TestMissingLambdaBinaryIsAnError(t *testing.T) {
	app := awscdk.NewApp(nil)
	_, err := NewCapacityStack(app, CapacityStackProps{Env: "local", AssetRoot: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make lambdas") {
		t.Errorf("err = %v, want a hint to run make lambdas", err)
	}
}

func TestConstructID(t *testing.T) {
	for in, want := range map[string]string{"api": "Api", "terminate-node": "TerminateNode", "reconciler": "Reconciler"} {
		if got := constructID(in); got != want {
			t.Errorf("constructID(%q) = %q, want %q", in, got, want)
		}
	}
}

// flatten renders a template value that holds a string (possibly an Fn::Join of strings and
// tokens) as one string, each token as a placeholder: ${AWS::Partition}, ${Id.Arn}, ${Id}.
func flatten(t *testing.T, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return v
	case map[string]any:
		if r, ok := v["Ref"].(string); ok && len(v) == 1 {
			return "${" + r + "}"
		}
		if a, ok := v["Fn::GetAtt"].([]any); ok && len(v) == 1 {
			return "${" + a[0].(string) + "." + a[1].(string) + "}"
		}
		if j, ok := v["Fn::Join"].([]any); ok && len(v) == 1 {
			var parts []string
			for _, p := range j[1].([]any) {
				parts = append(parts, flatten(t, p))
			}
			return strings.Join(parts, j[0].(string))
		}
	}
	t.Fatalf("cannot flatten %s", toJSON(v))
	return ""
}

// keysOf returns a JSON object's keys, sorted.
func keysOf(m any) []string {
	obj, _ := m.(map[string]any)
	return slices.Sorted(maps.Keys(obj))
}
