package layering

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// class is what a package is, for the import rules.
type class string

const (
	// Imports from outside the module.
	std      class = "the standard library"
	testLib  class = "testing" // the standard library's testing packages
	awsSDK   class = "an AWS library"
	external class = "a third-party module"

	// The module's own packages.
	domain     class = "the domain"
	domainSide class = "a package beside the domain" // no AWS, no adapter: shared by adapters and mains
	adapter    class = "an adapter"
	wiring     class = "the functions' configuration"
	faults     class = "the fault layer"
	callLog    class = "the call log" // the local stack's record of every AWS call, for its IAM check
	testKit    class = "a test-support package"
	function   class = "a function's main"
	floorMain  class = "the floor function's main"
	command    class = "a command"
	localStack class = "the local stack"
)

// packages gives each of the module's packages (by folder, relative to the module's root) its
// class; the first row that matches wins, "*" matches one folder name and a trailing "/..."
// any depth. A package that no row matches fails the test: give it a row.
var packages = []struct {
	dir   string
	class class
}{
	{"shared/capacity", domain},
	{"shared/auth", domainSide},
	{"shared/client", domainSide},
	{"shared/costunits", domainSide}, // docs/cost/units.json, written by a benchmark, read by infra/cost
	{"shared/emf", domainSide},
	{"shared/routes", domainSide},
	{"shared/stackoutput", domainSide},
	{"shared/stackname", domainSide},
	{"shared/table", domainSide},
	{"shared/trace", domainSide},
	{"shared/wire", domainSide},
	{"console", adapter}, // the web console's files, served over HTTP
	{"shared/agent", adapter},
	{"shared/dynamo", adapter},
	{"shared/eventapi", adapter},
	{"shared/eventbus", adapter},
	{"shared/httpapi", adapter},
	{"shared/kmsseal", adapter},
	{"shared/scheduler", adapter},
	{"shared/secrets", adapter},
	{"shared/stepfn", adapter},
	{"shared/config", wiring},
	{"shared/config/envvar", wiring}, // the functions' variables (standard library only)
	{"shared/awsfault", faults},
	{"shared/calllog", callLog},
	{"shared/capacitytest", testKit},
	{"shared/dynamo/dynamotest", testKit},
	{"shared/emf/emftest", testKit},
	{"shared/layering", domainSide}, // only this test
	{"functions/floor", floorMain},
	{"functions/*", function},
	{"cmd/*", command},
	{"localstack/...", localStack},
}

// may lists the classes each class's product files may import. Test files are not held to
// it: a test may reach across layers (the domain's tests run on the real store).
var may = map[class][]class{
	domain:     {std},
	domainSide: {std, domain, domainSide},
	adapter:    {std, awsSDK, domain, domainSide},                                   // never another adapter
	wiring:     {std, awsSDK, domain, domainSide, adapter, faults, callLog, wiring}, // shared/config reads through shared/config/envvar and builds the adapters the mains share
	faults:     {std, awsSDK},
	callLog:    {std, awsSDK, domainSide}, // the table package: which key attribute it records
	testKit:    {std, testLib, awsSDK, external, domain, domainSide, adapter, faults},
	function:   {std, awsSDK, domain, domainSide, adapter, wiring},
	floorMain:  {std, awsSDK, wiring, localStack}, // the benchmark's floor lives in the local stack
	command:    {std, awsSDK, domain, domainSide, adapter, wiring},
	localStack: {std, testLib, awsSDK, external, domain, domainSide, adapter, wiring, faults, callLog, testKit, localStack},
}

// maxMainLines bounds a function's main.go: reading configuration, building clients and
// handing them to lambda.Start fits well within it.
const maxMainLines = 200

// module is what check read: the module's path and its packages' classes.
type module struct {
	path     string
	packages map[string]class // by folder
}

// check reads the Go module at root (not its nested modules, testdata or node_modules) and
// returns every break of the rules, one line each, sorted.
func check(root string) (module, []string, error) {
	mod := module{packages: map[string]class{}}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return mod, nil, fmt.Errorf("read the module's go.mod: %w", err)
	}
	for line := range strings.Lines(string(gomod)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			mod.path = strings.TrimSpace(p)
		}
	}
	if mod.path == "" {
		return mod, nil, fmt.Errorf("no module line in %s/go.mod", root)
	}
	var broken []string
	files := map[string][]string{} // product files by folder
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || exists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			dir, _ := filepath.Rel(root, filepath.Dir(p))
			files[filepath.ToSlash(dir)] = append(files[filepath.ToSlash(dir)], p)
		}
		return nil
	})
	if err != nil {
		return mod, nil, fmt.Errorf("walk %s: %w", root, err)
	}
	for dir := range files {
		c, ok := classOf(dir)
		if !ok {
			broken = append(broken, fmt.Sprintf("%s: no class: add a row for it to packages", dir))
			continue
		}
		mod.packages[dir] = c
	}
	fset := token.NewFileSet()
	for dir, paths := range files {
		c, ok := mod.packages[dir]
		if !ok {
			continue
		}
		for _, p := range paths {
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				return mod, nil, fmt.Errorf("parse %s: %w", p, err)
			}
			name := dir + "/" + filepath.Base(p)
			for _, imp := range f.Imports {
				ip := strings.Trim(imp.Path.Value, `"`)
				ic, ok := mod.classOfImport(ip)
				if ok && !slices.Contains(may[c], ic) {
					broken = append(broken, fmt.Sprintf("%s imports %s (%s): %s may import only %s", name, ip, ic, c, list(may[c])))
				}
			}
			if c == function || c == floorMain {
				broken = append(broken, mainWires(fset, name, f)...)
			}
		}
		if (c == function || c == floorMain) && (len(paths) != 1 || filepath.Base(paths[0]) != "main.go") {
			broken = append(broken, fmt.Sprintf("%s: a function's folder holds main.go alone (beside its tests), has %s", dir, baseNames(paths)))
		}
	}
	slices.Sort(broken)
	return mod, broken, nil
}

// mainWires returns where a function's main does more than wire: a method (a type that adapts
// one thing to another is an adapter, and belongs in an adapter's package) or a length past
// maxMainLines.
func mainWires(fset *token.FileSet, name string, f *ast.File) []string {
	var broken []string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv != nil {
			broken = append(broken, fmt.Sprintf("%s:%d: method %s: a main only wires; an adapter's methods belong in its package", name, fset.Position(fn.Pos()).Line, fn.Name.Name))
		}
	}
	if n := fset.File(f.Pos()).LineCount(); n > maxMainLines {
		broken = append(broken, fmt.Sprintf("%s: %d lines, over %d: a main only wires", name, n, maxMainLines))
	}
	return broken
}

// classOf is the class of the module's package in dir.
func classOf(dir string) (class, bool) {
	for _, row := range packages {
		if prefix, ok := strings.CutSuffix(row.dir, "/..."); ok {
			if dir == prefix || strings.HasPrefix(dir, prefix+"/") {
				return row.class, true
			}
			continue
		}
		if ok, _ := path.Match(row.dir, dir); ok {
			return row.class, true
		}
	}
	return "", false
}

// classOfImport is the class of an imported path; false for the module's own packages that
// have no class (reported once, as such).
func (m module) classOfImport(ip string) (class, bool) {
	if dir, ok := strings.CutPrefix(ip, m.path+"/"); ok {
		c, ok := m.packages[dir]
		return c, ok
	}
	first, _, _ := strings.Cut(ip, "/")
	switch {
	case ip == "testing" || strings.HasPrefix(ip, "testing/"):
		return testLib, true
	case !strings.Contains(first, "."):
		return std, true
	case strings.HasPrefix(ip, "github.com/aws/") || strings.HasPrefix(ip, "github.com/awslabs/"):
		return awsSDK, true
	}
	return external, true
}

func list(cs []class) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

func baseNames(paths []string) string {
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = filepath.Base(p)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
