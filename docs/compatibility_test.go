package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestLedgerNamesCode: every row of the compatibility ledger is numbered in order, says when
// its path can go, and names code that exists: each `dir.Name` or `dir.Type.Member` of its
// "where" cell, and each `folder/path.Name` of its "can go" cell, is a function, method, type,
// struct field, constant or variable declared in that folder of the repository.
func TestLedgerNamesCode(t *testing.T) {
	rows := ledgerRows(t, read(t, "compatibility.md"))
	if len(rows) < 20 {
		t.Fatalf("the ledger has %d rows", len(rows))
	}
	decls := map[string]map[string]bool{}
	for i, r := range rows {
		if r.number != strconv.Itoa(i+1) {
			t.Errorf("row %q: numbered %s, want %d", r.what, r.number, i+1)
		}
		if r.canGo == "" {
			t.Errorf("row %s: no removal condition", r.number)
		}
		if len(r.where) == 0 {
			t.Errorf("row %s: names no code", r.number)
		}
		for _, ref := range append(r.where, r.mentions...) {
			if err := resolve(ref, "..", decls); err != nil {
				t.Errorf("row %s: %v", r.number, err)
			}
		}
	}
}

// ledgerRow is one row of a ledger table: | # | what | where | can go when |.
type ledgerRow struct {
	number, what, canGo string
	where               []string // the code references of the where cell
	mentions            []string // those of the can-go cell that name a folder path
}

var codeRef = regexp.MustCompile("`([a-z][a-z0-9_/-]*\\.[A-Za-z_][A-Za-z0-9_.]*)`")

// ledgerRows returns the rows of every table of doc whose first cell is a number.
func ledgerRows(t *testing.T, doc string) []ledgerRow {
	t.Helper()
	var rows []ledgerRow
	for _, line := range proseLines(doc) {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| ") || len(cells) != 4 {
			continue
		}
		if _, err := strconv.Atoi(cells[0]); err != nil {
			continue
		}
		r := ledgerRow{number: cells[0], what: cells[1], canGo: strings.TrimSpace(cells[3])}
		for _, m := range codeRef.FindAllStringSubmatch(cells[2], -1) {
			r.where = append(r.where, m[1])
		}
		for _, m := range codeRef.FindAllStringSubmatch(cells[3], -1) {
			if strings.Contains(m[1], "/") {
				r.mentions = append(r.mentions, m[1])
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// resolve checks that ref ("shared/dynamo.Store.GetKey": the folder, then the name as
// declared in it) names a declaration under root. decls caches each folder's declarations.
func resolve(ref, root string, decls map[string]map[string]bool) error {
	slash := strings.LastIndex(ref, "/")
	dot := strings.Index(ref[slash+1:], ".")
	if dot < 0 {
		return fmt.Errorf("%s: want folder.Name", ref)
	}
	dir, name := ref[:slash+1+dot], ref[slash+1+dot+1:]
	if decls[dir] == nil {
		names, err := declarations(filepath.Join(root, dir))
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		decls[dir] = names
	}
	if !decls[dir][name] {
		return fmt.Errorf("%s: %s declares no %s", ref, dir, name)
	}
	return nil
}

// declarations returns the names declared by the Go files (tests left out) of dir: functions,
// types, constants and variables by name, methods and struct fields as Type.Name.
func declarations(dir string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				names[receiverPrefix(d)+d.Name.Name] = true
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					case *ast.TypeSpec:
						names[s.Name.Name] = true
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, field := range st.Fields.List {
								for _, n := range field.Names {
									names[s.Name.Name+"."+n.Name] = true
								}
							}
						}
					}
				}
			}
		}
	}
	return names, nil
}

// receiverPrefix is "Type." for a method (of Type or *Type), "" for a function.
func receiverPrefix(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	typ := d.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "."
	}
	return ""
}

// TestResolve: a reference resolves only to a declaration of the folder it names.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "shared", "store"), 0o755); err != nil {
		t.Fatal(err)
	}
	src := `package store

type Store struct{ Retention int }

type item struct{ Attempt int }

const legacyPrefix = "OP#"

func (s *Store) GetKey() {}

func readScoped() {}
`
	if err := os.WriteFile(filepath.Join(dir, "shared", "store", "store.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ref string
		ok  bool
	}{
		{"shared/store.Store.GetKey", true},
		{"shared/store.readScoped", true},
		{"shared/store.legacyPrefix", true},
		{"shared/store.item.Attempt", true},
		{"shared/store.Store.Retention", true},
		{"shared/store.Store", true},
		{"shared/store.Store.Migrate", false},
		{"shared/store.GetKey", false},
		{"shared/other.Store", false},
		{"shared/store", false},
	}
	for _, tt := range tests {
		if err := resolve(tt.ref, dir, map[string]map[string]bool{}); (err == nil) != tt.ok {
			t.Errorf("resolve(%q) = %v, want ok %v", tt.ref, err, tt.ok)
		}
	}
}
