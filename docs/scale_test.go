package docs

import (
	"strconv"
	"strings"
	"testing"

	"github.com/openrelay/capacity/localstack/quota"
)

// TestScaleTableIsTheCodesTable: docs/scale.md's table of AWS quotas has exactly the rows of
// quota.Defaults, with the same bucket, refill and source, so neither drifts from the other.
func TestScaleTableIsTheCodesTable(t *testing.T) {
	doc := read(t, "scale.md")
	_, section, ok := strings.Cut(doc, "## AWS quotas the local stack models")
	if !ok {
		t.Fatal("docs/scale.md has no section \"AWS quotas the local stack models\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	got := map[string][]string{}
	for line := range strings.SplitSeq(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) != 8 {
			t.Fatalf("row %q: want 8 cells", line)
		}
		got[strings.Trim(cells[0], "`")+" "+cells[1]] = cells
	}
	num := func(s string) float64 {
		if s == "-" {
			return 0
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		if err != nil {
			t.Errorf("%q is not a number", s)
		}
		return f
	}
	for _, r := range quota.Defaults {
		key := string(r.ID) + " " + r.Region
		cells, ok := got[key]
		if !ok {
			t.Errorf("docs/scale.md has no row for %s", key)
			continue
		}
		delete(got, key)
		if num(cells[3]) != r.Bucket || num(cells[4]) != r.Refill {
			t.Errorf("%s: the doc says bucket %s refill %s, the code %v and %v", key, cells[3], cells[4], r.Bucket, r.Refill)
		}
		if !strings.Contains(cells[7], "("+r.Source+")") {
			t.Errorf("%s: the doc's source %s is not the code's %s", key, cells[7], r.Source)
		}
	}
	for key := range got {
		t.Errorf("docs/scale.md has a row for %s, which the code does not model", key)
	}
}
