package costunits

import (
	"os"
	"testing"
)

// The file in the repository reads back and writes out as it is: Marshal is the format the
// benchmark keeps, Parse the one the pricing reads, and nothing is lost between them.
func TestUnitsFileRoundTrips(t *testing.T) {
	b, err := os.ReadFile("../../docs/cost/units.json")
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(f.Marshal()); got != string(b) {
		t.Errorf("docs/cost/units.json parsed and written again differs from the file:\n%s", got)
	}
}

func TestParseRefusesAFileWithoutCases(t *testing.T) {
	for _, in := range []string{`{"command":"x","cases":{}}`, `{"command":"x"}`, `[`} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%s): no error", in)
		}
	}
}
