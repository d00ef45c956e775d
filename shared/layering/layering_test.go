package layering

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportRules holds the module to the rules: the domain imports only the standard
// library, no adapter imports another, nothing in the product imports the local stack or test
// support, and each function's main only wires.
func TestImportRules(t *testing.T) {
	mod, broken, err := check(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range broken {
		t.Error(b)
	}
	// The rules bind only if the walk found the packages they speak of.
	for dir, want := range map[string]class{
		"shared/capacity": domain, "shared/dynamo": adapter, "shared/httpapi": adapter,
		"functions/api": function, "localstack/stack": localStack,
	} {
		if got := mod.packages[dir]; got != want {
			t.Errorf("%s read as %q, want %q", dir, got, want)
		}
	}
}

// TestPlantedBreaksFail plants each kind of break in a module of its own and checks that
// check reports it, and that a module keeping the rules passes.
func TestPlantedBreaksFail(t *testing.T) {
	const mod = "example.com/m"
	pkg := func(name string, imports ...string) string {
		s := "package " + name + "\n\nimport (\n"
		for _, ip := range imports {
			s += "\t_ " + `"` + ip + `"` + "\n"
		}
		return s + ")\n"
	}
	mainWith := func(extra string) string { return "package main\n\nfunc main() {}\n" + extra }
	cases := []struct {
		name  string
		files map[string]string
		want  string // "" for no break
	}{
		{"rules kept", map[string]string{
			"shared/capacity/c.go":      pkg("capacity", "context"),
			"shared/capacity/c_test.go": pkg("capacity_test", mod+"/shared/dynamo", "github.com/aws/aws-sdk-go-v2/aws"),
			"shared/dynamo/d.go":        pkg("dynamo", mod+"/shared/capacity", mod+"/shared/table", "github.com/aws/aws-sdk-go-v2/aws"),
			"shared/table/t.go":         pkg("table"),
			"functions/api/main.go":     mainWith(""),
		}, ""},
		{"domain imports AWS", map[string]string{
			"shared/capacity/c.go": pkg("capacity", "github.com/aws/aws-sdk-go-v2/aws"),
		}, "shared/capacity/c.go imports github.com/aws/aws-sdk-go-v2/aws (an AWS library): the domain may import only"},
		{"domain imports an adapter", map[string]string{
			"shared/capacity/c.go": pkg("capacity", mod+"/shared/dynamo"),
			"shared/dynamo/d.go":   pkg("dynamo"),
		}, "shared/capacity/c.go imports example.com/m/shared/dynamo (an adapter)"},
		{"domain imports a third-party module", map[string]string{
			"shared/capacity/c.go": pkg("capacity", "pgregory.net/rapid"),
		}, "(a third-party module): the domain"},
		{"adapter imports another", map[string]string{
			"shared/stepfn/s.go":   pkg("stepfn", mod+"/shared/eventbus"),
			"shared/eventbus/e.go": pkg("eventbus"),
		}, "shared/stepfn/s.go imports example.com/m/shared/eventbus (an adapter): an adapter may import only"},
		{"product imports test support", map[string]string{
			"shared/httpapi/h.go":            pkg("httpapi", mod+"/shared/dynamo/dynamotest"),
			"shared/dynamo/dynamotest/dt.go": pkg("dynamotest"),
		}, "(a test-support package): an adapter"},
		{"product imports testing", map[string]string{
			"shared/wire/w.go": pkg("wire", "testing"),
		}, "shared/wire/w.go imports testing (testing)"},
		{"main imports the local stack", map[string]string{
			"functions/api/main.go": pkg("main", mod+"/localstack/demo"),
			"localstack/demo/d.go":  pkg("demo"),
		}, "functions/api/main.go imports example.com/m/localstack/demo (the local stack): a function's main"},
		{"main holds a method", map[string]string{
			"functions/api/main.go": mainWith("type a struct{}\n\nfunc (a) Terminate() {}\n"),
		}, "functions/api/main.go:6: method Terminate: a main only wires"},
		{"main too long", map[string]string{
			"functions/api/main.go": mainWith(strings.Repeat("\n", maxMainLines)),
		}, "functions/api/main.go: 203 lines, over 200"},
		{"function with a second file", map[string]string{
			"functions/api/main.go":   mainWith(""),
			"functions/api/decide.go": "package main\n",
		}, "functions/api: a function's folder holds main.go alone (beside its tests), has decide.go, main.go"},
		{"package with no class", map[string]string{
			"shared/newthing/n.go": pkg("newthing"),
		}, "shared/newthing: no class"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			c.files["go.mod"] = "module " + mod + "\n\ngo 1.26\n"
			for name, text := range c.files {
				p := filepath.Join(root, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, broken, err := check(root)
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if len(broken) != 0 {
					t.Fatalf("reported %q, want nothing", broken)
				}
				return
			}
			for _, b := range broken {
				if strings.Contains(b, c.want) {
					return
				}
			}
			t.Fatalf("reported %q, want a line with %q", broken, c.want)
		})
	}
}
