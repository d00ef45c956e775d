// Package costunits is docs/cost/units.json: what each step of a typical reclaim read and
// wrote in DynamoDB, call by call, and what else it did. BenchmarkReclaimUnits
// (shared/capacity) writes it; infra/cost prices it against the synthesised template. One
// definition for both sides, so that a field the benchmark adds is one the pricing reads.
package costunits

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// File is the whole file: per case ("grace-0", "grace-120") what each step did.
type File struct {
	Command string          `json:"command"`
	Cases   map[string]Case `json:"cases"`
}

// Case is one reclaim.
type Case struct {
	Victims      int `json:"victims"`
	GraceSeconds int `json:"graceSeconds"`
	// Steps: "api" (one call), then each workflow task by its state name.
	Steps map[string]Step `json:"steps"`
	// Stored lists the items the reclaim created that stay: their attributes' sizes and how
	// long they stay (their TTL; 0 for good).
	Stored []Item `json:"stored"`
}

// Step is what one step did.
type Step struct {
	Reads  []Read  `json:"reads,omitempty"`
	Writes []Write `json:"writes,omitempty"`
	// Events published to the bus, and workflow executions started.
	Events int `json:"events,omitempty"`
	Starts int `json:"starts,omitempty"`
	// AgentNotices: eviction notices sent to agents (each opens the node's agent key).
	AgentNotices int `json:"agentNotices,omitempty"`
	AgentCalls   int `json:"agentCalls,omitempty"`
}

// Read is one read call: the bytes of every item it read (a Query's before any filter).
type Read struct {
	Table      string `json:"table"`
	Op         string `json:"op"`
	Items      int    `json:"items"`
	Bytes      int    `json:"bytes"`
	Consistent bool   `json:"consistent"`
}

// Write is one item written: the size of each attribute before and after (none: no item),
// which attributes changed, and whether inside a transaction.
type Write struct {
	Table       string         `json:"table"`
	Op          string         `json:"op"`
	Transaction bool           `json:"transaction,omitempty"`
	Before      map[string]int `json:"before,omitempty"`
	After       map[string]int `json:"after,omitempty"`
	Changed     []string       `json:"changed,omitempty"`
}

// Item is an item the reclaim leaves stored, and for how long (0: for good).
type Item struct {
	Table      string         `json:"table"`
	Attributes map[string]int `json:"attributes"`
	TTLSeconds int64          `json:"ttlSeconds,omitempty"`
}

// Parse reads the file.
func Parse(b []byte) (File, error) {
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return f, err
	}
	if len(f.Cases) == 0 {
		return f, fmt.Errorf("no cases")
	}
	return f, nil
}

// Marshal writes the file as JSON with one call or item a line, so that a change of the
// code shows in its diff as the calls it changed.
func (f File) Marshal() []byte {
	one := func(v any) string {
		j, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return string(j)
	}
	list := func(b *strings.Builder, indent string, n int, item func(int) string) {
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n" + indent + "  " + item(i))
		}
		if n > 0 {
			b.WriteString("\n" + indent)
		}
		b.WriteString("]")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{\n  \"command\": %s,\n  \"cases\": {", one(f.Command))
	for i, name := range slices.Sorted(maps.Keys(f.Cases)) {
		c := f.Cases[name]
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "\n    %s: {\n      \"victims\": %d,\n      \"graceSeconds\": %d,\n      \"steps\": {", one(name), c.Victims, c.GraceSeconds)
		for j, step := range slices.Sorted(maps.Keys(c.Steps)) {
			st := c.Steps[step]
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "\n        %s: {\"events\": %d, \"starts\": %d, \"agentNotices\": %d, \"agentCalls\": %d,\n          \"reads\": ",
				one(step), st.Events, st.Starts, st.AgentNotices, st.AgentCalls)
			list(&b, "          ", len(st.Reads), func(k int) string { return one(st.Reads[k]) })
			b.WriteString(",\n          \"writes\": ")
			list(&b, "          ", len(st.Writes), func(k int) string { return one(st.Writes[k]) })
			b.WriteString("}")
		}
		b.WriteString("\n      },\n      \"stored\": ")
		list(&b, "      ", len(c.Stored), func(k int) string { return one(c.Stored[k]) })
		b.WriteString("\n    }")
	}
	b.WriteString("\n  }\n}\n")
	return []byte(b.String())
}
