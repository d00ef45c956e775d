package cost

import (
	"fmt"
	"slices"
)

// Demand is what one reclaim asks of each throttled AWS resource: the per-reclaim side of
// docs/scale.md's "Fleet sizes", from the same template and units the bill is priced on.
type Demand struct {
	APIRequests float64            // API Gateway requests
	Starts      map[string]float64 // StartExecution calls by state machine type (STANDARD, EXPRESS)
	Transitions float64            // Standard state transitions
	PutEvents   float64            // PutEvents requests: one per step that publishes
	QueueSends  float64            // SQS messages sent (the waits of a workflow on a queue)
	// Seconds is the invocation time a reclaim takes of each function: at a rate of r
	// reclaims a second, a function runs r × Seconds at once (Little's law).
	Seconds map[string]float64
	WRU     map[string]float64 // write units by "table" and "table/index"
	RRU     map[string]float64 // read units by table
	// HotStateKeyWRU is the write units a reclaim puts on one key of the byState index: its
	// operation's entry put under a state and, when the operation moves on, deleted from it.
	// Every operation in that state shares the key (or one of its shards).
	HotStateKeyWRU float64
	// CallerKeyWRU is the write units a reclaim puts on its API key's limiter item (one item,
	// so one partition, per key).
	CallerKeyWRU float64
}

// ByStateIndex is the index of operations by state (gsi1).
const ByStateIndex = "byState"

// Demand walks the runs a reclaim starts, as Price does, and adds up what they ask of each
// throttled resource.
func (d Design) Demand(u Case, a Assumptions) (Demand, error) {
	dm := Demand{APIRequests: 1, Starts: map[string]float64{}, Seconds: map[string]float64{}}
	if len(d.APIs) != 1 || d.APIs[0].Function == "" {
		return dm, fmt.Errorf("want one REST API proxying to one function, have %+v", d.APIs)
	}
	api := d.APIs[0].Function
	seconds := func(step, fn string) error {
		ms, ok := a.DurationMS[step]
		if !ok {
			return fmt.Errorf("how long %s runs for step %s is not known (Assumptions.DurationMS)", fn, step)
		}
		dm.Seconds[fn] += ms / 1000
		return nil
	}
	if err := seconds("api", api); err != nil {
		return dm, err
	}
	executions := 0 // runs walked so far: a run reads its step from Assumptions.Run by its index
	var run func(name string, depth int) error
	run = func(name string, depth int) error {
		sm, ok := d.StateMachines[name]
		if !ok {
			return fmt.Errorf("state machine %q is not in the template", name)
		}
		if depth > 5 {
			return fmt.Errorf("state machines start each other more than 5 deep (at %s)", name)
		}
		dm.Starts[sm.Type]++
		visits, err := Walk(sm.Definition, a.Run(u, executions))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		executions++
		if sm.Type != "EXPRESS" {
			dm.Transitions += float64(len(visits))
		}
		for _, v := range visits {
			switch {
			case v.Function != "":
				if err := seconds(v.State, v.Function); err != nil {
					return err
				}
			case v.Queue != "":
				dm.QueueSends++
				for fn, f := range d.Functions {
					if slices.Contains(f.Queues, v.Queue) {
						if err := seconds(v.Queue, fn); err != nil {
							return err
						}
					}
				}
			case v.StartsMachine != "":
				if err := run(v.StartsMachine, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, step := range sortedKeys(u.Steps) {
		st := u.Steps[step]
		if st.Events > 0 {
			dm.PutEvents++
		}
		if st.Starts == 0 {
			continue
		}
		machines := d.Functions[api].StateMachines
		if step != "api" || len(machines) != 1 {
			return dm, fmt.Errorf("step %s starts executions of %v: which one is not known", step, machines)
		}
		for range st.Starts {
			if err := run(machines[0], 0); err != nil {
				return dm, err
			}
		}
	}

	dy, err := d.dynamo(u)
	if err != nil {
		return dm, err
	}
	dm.WRU, dm.RRU = dy.byTable, dy.readsByTable
	var put, del float64
	for _, st := range u.Steps {
		for _, w := range st.Writes {
			if w.Table == "limits" {
				dm.CallerKeyWRU += kb(max(sum(w.Before), sum(w.After)))
			}
			for _, ix := range d.Tables[w.Table].Indexes {
				if ix.Name != ByStateIndex || !slices.Contains(w.Changed, ix.Keys[0]) {
					continue
				}
				if a := ix.projected(w.After, tableKeys); a != nil {
					put = max(put, kb(sum(a)))
				}
				if b := ix.projected(w.Before, tableKeys); b != nil {
					del = max(del, kb(sum(b)))
				}
			}
		}
	}
	dm.HotStateKeyWRU = put + del
	return dm, nil
}
