package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEMapsEveryPackage: the README's map of the repository names every folder of Go
// code under shared/, functions/, cmd/ and localstack/, so a new package is placed for the
// next reader when it is added, not found by accident later.
func TestREADMEMapsEveryPackage(t *testing.T) {
	readme := read(t, "../README.md")
	for _, dir := range goFolders(t, "..", "shared", "functions", "cmd", "localstack") {
		if !strings.Contains(readme, "| `"+dir+"`") && !strings.Contains(readme, "| `"+dir+"/`") {
			t.Errorf("README.md's map of the repository has no row for `%s`", dir)
		}
	}
}

// goFolders returns the folders below root/tops holding a non-test .go file, as paths from
// root, leaving out testdata and the folders inside a package that only serve it.
func goFolders(t *testing.T, root string, tops ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	var dirs []string
	for _, top := range tops {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if !seen[rel] {
				seen[rel] = true
				dirs = append(dirs, rel)
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if len(dirs) == 0 {
		t.Fatal("no Go folders found: is the test run from docs/?")
	}
	return dirs
}
