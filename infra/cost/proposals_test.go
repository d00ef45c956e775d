package cost

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// The changes of domain and store code that would cut DynamoDB's share of a reclaim, each
// written as what it does to the measured calls and items, so that its effect is priced by
// the same model as the table of docs/cost.md (on the Express design, TestPriceOfTheExpressDesign).
// None weakens a guarantee: the audit record, the operation, its outcomes and the VMs'
// history stay readable for as long as today, every write that guards exactly-once
// termination stays, and PITR stays on the tables that hold them. They are proposals for the
// owners of shared/capacity and shared/dynamo; docs/cost.md lists them with these figures:
//
//	cd infra/cost && go test -run TestProposals -v .
type proposal struct {
	name  string
	apply func(d *Design, c *Case, a *Assumptions)
}

const day = 86400

// is says what an item is, from the attributes the store writes.
func is(attrs map[string]int, what string) bool {
	has := func(k string) bool { _, ok := attrs[k]; return ok }
	switch what {
	case "operation":
		return has("gsi2pk") && has("victims")
	case "claim":
		return has("Holder")
	case "notice":
		return has("NoticeState")
	case "outcome":
		return has("Outcome") && has("VMID") && !has("hash")
	case "history":
		return has("Tier")
	}
	return false
}

var proposals = []proposal{
	{"no begin write: the API's transaction writes the operation as terminating with its execution's name (the name is the reclaim id and attempt), and the reconciler's no-progress bound covers a start that failed", func(d *Design, c *Case, a *Assumptions) {
		for name, st := range c.Steps {
			var keep []Write
			for _, w := range st.Writes {
				if is(w.After, "operation") && w.Before != nil && !slices.Contains(w.Changed, "expiresAt") {
					continue // pending_start -> terminating
				}
				keep = append(keep, w)
			}
			st.Writes = keep
			c.Steps[name] = st
		}
	}},
	{"attribute names of 2 bytes in the state and audit tables (the keys' names kept): a migration of every item", func(d *Design, c *Case, a *Assumptions) {
		short := func(m map[string]int) map[string]int {
			if m == nil {
				return nil
			}
			out := map[string]int{}
			for k, v := range m {
				if len(k) > 2 {
					v -= len(k) - 2
				}
				out[k] = v
			}
			return out
		}
		for _, st := range c.Steps {
			for i, w := range st.Writes {
				if w.Table == "state" || w.Table == "audit" {
					st.Writes[i].Before, st.Writes[i].After = short(w.Before), short(w.After)
				}
			}
		}
		for i, it := range c.Stored {
			if it.Table == "state" || it.Table == "audit" {
				c.Stored[i].Attributes = short(it.Attributes)
			}
		}
	}},
}

func without(m map[string]int, keys ...string) map[string]int {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

func with(m, more map[string]int) map[string]int {
	out := maps.Clone(m)
	maps.Copy(out, more)
	return out
}

func cloneCase(t *testing.T, c Case) Case {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out Case
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func cloneDesign(d Design) Design {
	out := d
	out.Tables = maps.Clone(d.Tables)
	return out
}

// Each proposal, alone and together with those before it, priced on the Express design
// (TestPriceOfTheExpressDesign): each saves, and none changes anything but DynamoDB and the
// logs.
func TestProposals(t *testing.T) {
	before, units := kept(t)
	base := withExpress(t, before)
	var report strings.Builder
	for _, key := range []string{"grace-0", "grace-120"} {
		c := units.Cases[key]
		b0, err := Price(base, c, EUWest1, Typical)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&report, "\n%s: Express design: $%.2f (DynamoDB $%.2f)\n", key, b0.Total()*1e6, b0.ByService()["DynamoDB"]*1e6)
		dAll, cAll, aAll := cloneDesign(base), cloneCase(t, c), Typical
		last := b0
		for _, p := range proposals {
			d1, c1, a1 := cloneDesign(base), cloneCase(t, c), Typical
			p.apply(&d1, &c1, &a1)
			alone, err := Price(d1, c1, EUWest1, a1)
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			p.apply(&dAll, &cAll, &aAll)
			all, err := Price(dAll, cAll, EUWest1, aAll)
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			saved := (b0.Total() - alone.Total()) * 1e6
			if key == "grace-120" || !strings.Contains(p.name, "notice") {
				if saved <= 0 {
					t.Errorf("%s, %s: saves $%.2f", key, p.name, saved)
				}
			}
			for s, v := range alone.ByService() {
				if s != "DynamoDB" && s != "CloudWatch Logs" && v != b0.ByService()[s] {
					t.Errorf("%s, %s: %s changes", key, p.name, s)
				}
			}
			fmt.Fprintf(&report, "  -$%.2f alone, $%.2f with those above: %s\n", saved, all.Total()*1e6, p.name)
			last = all
		}
		fmt.Fprintf(&report, "  all: $%.2f per million\n", last.Total()*1e6)
		for _, l := range last.Lines {
			if l.USD*1e6 >= 0.5 {
				fmt.Fprintf(&report, "    %s, %s: %s, $%.2f\n", l.Service, l.What, l.Quantity, l.USD*1e6)
			}
		}
	}
	t.Log(report.String())
}
