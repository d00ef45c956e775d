package cost

import (
	"fmt"
	"math"
	"slices"

	"github.com/openrelay/capacity/shared/costunits"
)

// The units of a reclaim (docs/cost/units.json) are shared/costunits' types: the benchmark
// that writes the file and this package that prices it read one definition.
type (
	Units = costunits.File
	Case  = costunits.Case
	Step  = costunits.Step
	Read  = costunits.Read
	Write = costunits.Write
	Item  = costunits.Item
)

// ParseUnits reads docs/cost/units.json.
func ParseUnits(b []byte) (Units, error) { return costunits.Parse(b) }

// dynamoUse is a reclaim's DynamoDB request units, by table and index.
type dynamoUse struct {
	rru, wru     float64
	indexWRU     float64
	byTable      map[string]float64 // WRU by "table" and "table/index"
	readsByTable map[string]float64
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// readUnits: 1 per 4 KB strongly consistent, summed over a call's items and rounded up, 1 at
// least; half that eventually consistent.
func readUnits(r Read) float64 {
	u := math.Max(1, math.Ceil(float64(r.Bytes)/4096))
	if !r.Consistent {
		u /= 2
	}
	return u
}

// kb is the write units of an item of n bytes: 1 per KB started, 1 at least.
func kb(n int) float64 { return math.Max(1, math.Ceil(float64(n)/1024)) }

// projected is the part of an item an index holds (nil: the item is not in it).
func (ix Index) projected(item map[string]int, tableKeys []string) map[string]int {
	if item == nil {
		return nil
	}
	for _, k := range ix.Keys {
		if _, ok := item[k]; !ok {
			return nil
		}
	}
	if ix.Projection == "ALL" {
		return item
	}
	keep := slices.Concat(tableKeys, ix.Keys)
	if ix.Projection == "INCLUDE" {
		keep = append(keep, ix.Include...)
	}
	out := map[string]int{}
	for _, k := range keep {
		if v, ok := item[k]; ok {
			out[k] = v
		}
	}
	return out
}

// indexWrites is the write units a write of the item costs in the index: nothing when the
// item is in it neither before nor after, or none of what it projects changed; a delete and
// a put when the entry's key changed; else one write of the larger entry.
func (ix Index) indexWrites(w Write, tableKeys []string) float64 {
	b, a := ix.projected(w.Before, tableKeys), ix.projected(w.After, tableKeys)
	if b == nil && a == nil {
		return 0
	}
	touched := false
	keyMoved := false
	for _, c := range w.Changed {
		if _, in := b[c]; in {
			touched = true
		}
		if _, in := a[c]; in {
			touched = true
		}
		if slices.Contains(ix.Keys, c) {
			keyMoved = true
		}
	}
	switch {
	case !touched:
		return 0
	case b != nil && a != nil && keyMoved:
		return kb(sum(b)) + kb(sum(a))
	case b == nil:
		return kb(sum(a))
	case a == nil:
		return kb(sum(b))
	}
	return kb(max(sum(b), sum(a)))
}

// tableKeys are the base tables' key attributes (every table of the stack: pk, sk).
var tableKeys = []string{"pk", "sk"}

// dynamo prices the case's DynamoDB calls against the design's tables and indexes.
func (d Design) dynamo(c Case) (dynamoUse, error) {
	u := dynamoUse{byTable: map[string]float64{}, readsByTable: map[string]float64{}}
	for _, name := range sortedKeys(c.Steps) {
		st := c.Steps[name]
		for _, r := range st.Reads {
			if _, ok := d.Tables[r.Table]; !ok {
				return u, fmt.Errorf("step %s reads table %q, which the template does not have", name, r.Table)
			}
			u.rru += readUnits(r)
			u.readsByTable[r.Table] += readUnits(r)
		}
		for _, w := range st.Writes {
			t, ok := d.Tables[w.Table]
			if !ok {
				return u, fmt.Errorf("step %s writes table %q, which the template does not have", name, w.Table)
			}
			units := kb(max(sum(w.Before), sum(w.After)))
			if w.Transaction {
				units *= 2
			}
			u.wru += units
			u.byTable[w.Table] += units
			if w.Op == "TransactWriteItems check" {
				continue // a ConditionCheck writes no index
			}
			for _, ix := range t.Indexes {
				n := ix.indexWrites(w, tableKeys)
				u.indexWRU += n
				u.byTable[w.Table+"/"+ix.Name] += n
			}
		}
	}
	return u, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
