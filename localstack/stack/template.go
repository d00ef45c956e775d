package stack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// template is the part of a CloudFormation template the runner reads. Values stay as decoded
// JSON (map[string]any, []any, string, json.Number, bool, nil) until the resolver turns
// intrinsic functions into concrete values.
type template struct {
	Parameters map[string]parameter      `json:"Parameters"`
	Mappings   map[string]map[string]any `json:"Mappings"`
	Conditions map[string]any            `json:"Conditions"`
	Resources  map[string]*resource      `json:"Resources"`
	Outputs    map[string]output         `json:"Outputs"`
}

type parameter struct {
	Type    string `json:"Type"`
	Default any    `json:"Default"`
}

type resource struct {
	Type       string         `json:"Type"`
	Properties map[string]any `json:"Properties"`
	Metadata   map[string]any `json:"Metadata"`
	DependsOn  any            `json:"DependsOn"`
	Condition  string         `json:"Condition"`
}

type output struct {
	Value       any    `json:"Value"`
	Description string `json:"Description"`
	Condition   string `json:"Condition"`
}

// functionMetadataKey marks a Lambda resource whose code is ./functions/<name> in the repo.
const functionMetadataKey = "capacity:function"

func loadTemplate(path string) (*template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}

	return parseTemplate(data)
}

func parseTemplate(data []byte) (*template, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// Numbers stay json.Number so that Fn::Join and Fn::Sub print them as written.
	dec.UseNumber()

	var t template
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}

	if len(t.Resources) == 0 {
		return nil, fmt.Errorf("parse template: no Resources")
	}

	for id, r := range t.Resources {
		if r == nil || r.Type == "" {
			return nil, fmt.Errorf("parse template: resource %s has no Type", id)
		}
	}

	return &t, nil
}

// stackNameFromPath derives the stack name the way `cdk synth` names its output:
// cdk.out/<StackName>.template.json.
func stackNameFromPath(path string) string {
	base := filepath.Base(path)
	for _, suffix := range []string{".template.json", ".json"} {
		if name, ok := strings.CutSuffix(base, suffix); ok {
			base = name

			break
		}
	}

	if base == "" || base == "." || base == "/" {
		return "local"
	}

	return base
}

// functionName returns the capacity:function metadata of a Lambda resource, or "".
func (r *resource) functionName() string {
	name, _ := r.Metadata[functionMetadataKey].(string)

	return name
}

// dependencies lists the resources r refers to (Ref, Fn::GetAtt, Fn::Sub) or names in DependsOn.
func (r *resource) dependencies(t *template) []string {
	deps := map[string]bool{}
	add := func(id string) {
		if _, ok := t.Resources[id]; ok {
			deps[id] = true
		}
	}

	switch d := r.DependsOn.(type) {
	case string:
		add(d)
	case []any:
		for _, v := range d {
			if s, ok := v.(string); ok {
				add(s)
			}
		}
	}

	collectRefs(r.Properties, add)

	out := make([]string, 0, len(deps))
	for id := range deps {
		out = append(out, id)
	}

	slices.Sort(out)

	return out
}

// collectRefs calls add for every logical id that v refers to. It over-approximates (a Ref
// inside an Fn::If branch that is not taken still counts), which only costs ordering freedom.
func collectRefs(v any, add func(string)) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 1 {
			if ref, ok := v["Ref"].(string); ok {
				add(ref)

				return
			}

			if ga, ok := v["Fn::GetAtt"]; ok {
				switch ga := ga.(type) {
				case []any:
					if len(ga) > 0 {
						if id, ok := ga[0].(string); ok {
							add(id)
						}
					}
				case string:
					id, _, _ := strings.Cut(ga, ".")
					add(id)
				}

				return
			}

			if sub, ok := v["Fn::Sub"]; ok {
				var text string

				switch sub := sub.(type) {
				case string:
					text = sub
				case []any:
					if len(sub) > 0 {
						text, _ = sub[0].(string)
					}

					if len(sub) > 1 {
						collectRefs(sub[1], add)
					}
				}

				for _, name := range subVariables(text) {
					id, _, _ := strings.Cut(name, ".")
					add(id)
				}

				return
			}
		}

		for _, e := range v {
			collectRefs(e, add)
		}
	case []any:
		for _, e := range v {
			collectRefs(e, add)
		}
	}
}

// order returns the logical ids in an order where every resource comes after the resources it
// depends on; ties are broken by logical id so runs are reproducible.
func (t *template) order() ([]string, error) {
	deps := map[string][]string{}
	dependents := map[string][]string{}
	pending := map[string]int{}

	for id, r := range t.Resources {
		deps[id] = r.dependencies(t)
		pending[id] = len(deps[id])

		for _, d := range deps[id] {
			dependents[d] = append(dependents[d], id)
		}
	}

	var ready []string

	for id, n := range pending {
		if n == 0 {
			ready = append(ready, id)
		}
	}

	out := make([]string, 0, len(t.Resources))

	for len(ready) > 0 {
		slices.Sort(ready)
		id := ready[0]
		ready = ready[1:]
		out = append(out, id)

		for _, d := range dependents[id] {
			pending[d]--
			if pending[d] == 0 {
				ready = append(ready, d)
			}
		}
	}

	if len(out) != len(t.Resources) {
		var cyclic []string

		for id, n := range pending {
			if n > 0 {
				cyclic = append(cyclic, id)
			}
		}

		slices.Sort(cyclic)

		return nil, fmt.Errorf("dependency cycle among resources %s", strings.Join(cyclic, ", "))
	}

	return out, nil
}
