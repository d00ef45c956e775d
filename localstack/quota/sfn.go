package quota

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// taskState is a Lambda task of a Standard state machine: the function it invokes, the
// constant fields of its payload (what tells two tasks of one function apart), and the state
// transitions AWS counts when the execution reaches it: the task itself and the states without
// a task entered since the task before (Wait, Choice, Pass).
type taskState struct {
	name        string
	function    string
	constants   map[string]any
	transitions float64
}

type aslState struct {
	Type       string
	Resource   string
	Next       string
	Default    string
	Choices    []struct{ Next string }
	Catch      []struct{ Next string }
	Parameters struct {
		FunctionName string
		Payload      map[string]any
	}
}

// taskStates reads a definition's Lambda tasks. Each task's transitions are 1 plus the fewest
// non-task states on a path to it from the start or from another task: a Wait before a task,
// a Choice after one. A loop that passes more states than the shortest path (a retry round
// through a Choice and a Wait) is undercounted by the difference: the approximation
// docs/scale.md names.
func taskStates(definition string) ([]taskState, error) {
	var def struct {
		StartAt string
		States  map[string]aslState
	}
	if err := json.Unmarshal([]byte(definition), &def); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	isTask := func(name string) bool { return def.States[name].Type == "Task" }
	before := map[string]int{}
	// From the start and from each task, walk the non-task states to the tasks they lead to.
	walk := func(from []string) {
		seen := map[string]bool{}
		type step struct {
			name string
			n    int
		}
		queue := []step{}
		for _, f := range from {
			queue = append(queue, step{f, 0})
		}
		for len(queue) > 0 {
			s := queue[0]
			queue = queue[1:]
			if s.name == "" || seen[s.name] {
				continue
			}
			seen[s.name] = true
			if isTask(s.name) {
				if old, ok := before[s.name]; !ok || s.n < old {
					before[s.name] = s.n
				}
				continue
			}
			for _, next := range successors(def.States[s.name]) {
				queue = append(queue, step{next, s.n + 1})
			}
		}
	}
	walk([]string{def.StartAt})
	for _, st := range def.States {
		if st.Type == "Task" {
			walk(successors(st))
		}
	}
	var out []taskState
	for name, st := range def.States {
		if st.Type != "Task" {
			continue
		}
		t := taskState{name: name, function: functionName(st), constants: map[string]any{}, transitions: float64(1 + before[name])}
		if t.function == "" {
			continue
		}
		for k, v := range st.Parameters.Payload {
			if !strings.HasSuffix(k, ".$") {
				t.constants[k] = v
			}
		}
		out = append(out, t)
	}
	return out, nil
}

func successors(st aslState) []string {
	out := []string{st.Next, st.Default}
	for _, c := range st.Choices {
		out = append(out, c.Next)
	}
	for _, c := range st.Catch {
		out = append(out, c.Next)
	}
	return out
}

// functionName is the name of the Lambda function a task invokes: the lambda:invoke
// integration's FunctionName, or a bare function ARN as the Resource.
func functionName(st aslState) string {
	ref := st.Parameters.FunctionName
	if !strings.Contains(st.Resource, ":states:::lambda:invoke") {
		ref = st.Resource
	}
	if i := strings.Index(ref, ":function:"); i >= 0 {
		ref = ref[i+len(":function:"):]
		name, _, _ := strings.Cut(ref, ":")
		return name
	}
	if strings.HasPrefix(ref, "arn:") {
		return ""
	}
	return ref
}

// transitionsOf is what an invoke of fn with payload costs in state transitions: the
// transitions of the task whose constant payload fields it carries (the one matching most
// of them), or 1 for a task it cannot tell.
func (m *Model) transitionsOf(fn string, payload map[string]any) (float64, bool) {
	best, bestScore, found := 1.0, -1, false
	for _, t := range m.tasks {
		if t.function != fn {
			continue
		}
		score := 0
		for k, v := range t.constants {
			if !reflect.DeepEqual(payload[k], v) {
				score = -1
				break
			}
			score++
		}
		if score > bestScore {
			best, bestScore, found = t.transitions, score, score >= 0
		}
	}
	return best, found
}
