package capacity

import (
	"testing"
	"time"
)

// Each fact that makes a plan is in its ETag: changing any one of them names another plan.
func TestPlanETagCoversEveryFact(t *testing.T) {
	base := func() *CapacityPlan {
		return &CapacityPlan{
			Action: ActionReclaim, Node: Node{ID: "n1", TopologyGen: 2}, Reservation: Reservation{ID: "r1", Version: 4},
			Released: []string{"u3"}, UnitIDs: []string{"u1", "u2"}, Grace: 10 * time.Second,
			Victims: []VM{{ID: "s1"}, {ID: "s2"}}, Skipped: []VM{{ID: "v1"}},
		}
	}
	tests := []struct {
		name   string
		change func(p *CapacityPlan)
		same   bool
	}{
		{"nothing", func(*CapacityPlan) {}, true},
		{"units in another order", func(p *CapacityPlan) { p.UnitIDs = []string{"u2", "u1"} }, true},
		{"victims in another order", func(p *CapacityPlan) { p.Victims = []VM{{ID: "s2"}, {ID: "s1"}} }, true},
		{"node id", func(p *CapacityPlan) { p.Node.ID = "n2" }, false},
		{"reservation id", func(p *CapacityPlan) { p.Reservation.ID = "r2" }, false},
		{"reservation version", func(p *CapacityPlan) { p.Reservation.Version = 5 }, false},
		{"topology generation", func(p *CapacityPlan) { p.Node.TopologyGen = 3 }, false},
		{"a unit more", func(p *CapacityPlan) { p.UnitIDs = []string{"u1", "u2", "u4"} }, false},
		{"released after", func(p *CapacityPlan) { p.Released = []string{} }, false},
		{"grace", func(p *CapacityPlan) { p.Grace = 0 }, false},
		{"a victim less", func(p *CapacityPlan) { p.Victims = p.Victims[:1] }, false},
		{"a victim skipped instead", func(p *CapacityPlan) { p.Victims, p.Skipped = p.Victims[:1], []VM{{ID: "s2"}, {ID: "v1"}} }, false},
		// Lists are not run together: [a,b][c] and [a][b,c] are different plans.
		{"a unit moved to released", func(p *CapacityPlan) { p.UnitIDs, p.Released = []string{"u1"}, []string{"u2", "u3"} }, false},
	}
	want := base().ETag()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base()
			tt.change(p)
			if got := p.ETag(); (got == want) != tt.same {
				t.Errorf("ETag %s, base %s: same = %v, want %v", got, want, got == want, tt.same)
			}
		})
	}
}
