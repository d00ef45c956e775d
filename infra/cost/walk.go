package cost

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Visit is one state a run enters.
type Visit struct {
	State string
	Type  string // Task, Wait, Choice, Pass, Succeed, Fail
	// For a Task: the function it invokes (lambda:invoke), the queue it sends to
	// (sqs:sendMessage) or the state machine it starts (states:startExecution).
	Function, Queue, StartsMachine string
	WaitSeconds                    float64
}

// Run is what a typical run knows of its data: the value of each path a Choice reads, and,
// for a Wait on a TimestampPath or SecondsPath, the seconds it waits. A path the definition
// reads and the run does not know fails the walk: a new branch of the workflow must be
// given its typical value, not guessed.
//
// A timestamp is given as seconds from the run's start (so "$.terminateAfter": 120 is a
// grace that ends two minutes after the run starts); the context's own times, "$$.State.EnteredTime"
// and "$$.Execution.StartTime", are 0: a typical run's states take milliseconds, not seconds.
type Run map[string]any

func (r Run) value(path string) (any, bool) {
	switch path {
	case "$$.State.EnteredTime", "$$.Execution.StartTime":
		return 0.0, true
	}
	v, ok := r[path]
	return v, ok
}

// Walk follows the definition from StartAt as a run with these values goes through it, and
// returns the states it enters, in order. Retries and catches are not taken (a typical run
// meets no error).
func Walk(definition json.RawMessage, run Run) ([]Visit, error) {
	var def struct {
		StartAt string                    `json:"StartAt"`
		States  map[string]map[string]any `json:"States"`
	}
	if err := json.Unmarshal(definition, &def); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	var out []Visit
	name := def.StartAt
	for name != "" {
		if len(out) > 1000 {
			return nil, fmt.Errorf("more than 1000 states entered: the run loops (at %s)", name)
		}
		s, ok := def.States[name]
		if !ok {
			return nil, fmt.Errorf("state %q is not in the definition", name)
		}
		v := Visit{State: name}
		v.Type, _ = s["Type"].(string)
		next, _ := s["Next"].(string)
		switch v.Type {
		case "Task":
			res, _ := s["Resource"].(string)
			params, _ := s["Parameters"].(map[string]any)
			switch {
			case strings.HasSuffix(res, ":states:::lambda:invoke"):
				v.Function, _ = params["FunctionName"].(string)
			case strings.HasPrefix(res, "arn:") && strings.Contains(res, ":lambda:") && strings.Contains(res, ":function:"):
				v.Function = res[strings.LastIndex(res, ":")+1:]
			case strings.HasSuffix(res, ":states:::sqs:sendMessage"):
				v.Queue, _ = params["QueueUrl"].(string)
			case strings.Contains(res, ":states:::states:startExecution"):
				v.StartsMachine, _ = params["StateMachineArn"].(string)
			default:
				return nil, fmt.Errorf("task %s: resource %q is not priced", name, res)
			}
		case "Wait":
			switch {
			case s["Seconds"] != nil:
				v.WaitSeconds, _ = s["Seconds"].(float64)
			case s["TimestampPath"] != nil || s["SecondsPath"] != nil:
				path, _ := s["TimestampPath"].(string)
				if path == "" {
					path, _ = s["SecondsPath"].(string)
				}
				sec, ok := run[path].(float64)
				if !ok {
					return nil, fmt.Errorf("wait %s: the run does not say how long %s waits", name, path)
				}
				v.WaitSeconds = sec
			case s["Timestamp"] != nil:
				return nil, fmt.Errorf("wait %s: a fixed timestamp is not priced", name)
			}
		case "Choice":
			next = ""
			choices, _ := s["Choices"].([]any)
			for _, c := range choices {
				rule, _ := c.(map[string]any)
				ok, err := matches(rule, run)
				if err != nil {
					return nil, fmt.Errorf("choice %s: %w", name, err)
				}
				if ok {
					next, _ = rule["Next"].(string)
					break
				}
			}
			if next == "" {
				next, _ = s["Default"].(string)
			}
			if next == "" {
				return nil, fmt.Errorf("choice %s: no rule matches the run and there is no Default", name)
			}
		case "Pass", "Succeed", "Fail":
		case "Map", "Parallel":
			return nil, fmt.Errorf("state %s: %s states are not priced yet", name, v.Type)
		default:
			return nil, fmt.Errorf("state %s: unknown type %q", name, v.Type)
		}
		out = append(out, v)
		if s["End"] == true || v.Type == "Succeed" || v.Type == "Fail" {
			break
		}
		name = next
	}
	return out, nil
}

// matches evaluates a Choice rule (JSONPath comparisons, And, Or, Not) against the run.
func matches(rule map[string]any, run Run) (bool, error) {
	if and, ok := rule["And"].([]any); ok {
		for _, r := range and {
			if ok, err := matches(r.(map[string]any), run); err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}
	if or, ok := rule["Or"].([]any); ok {
		for _, r := range or {
			if ok, err := matches(r.(map[string]any), run); err != nil || ok {
				return ok, err
			}
		}
		return false, nil
	}
	if not, ok := rule["Not"].(map[string]any); ok {
		ok, err := matches(not, run)
		return !ok, err
	}
	path, _ := rule["Variable"].(string)
	val, known := run.value(path)
	for op, want := range rule {
		switch op {
		case "Variable", "Next":
			continue
		case "IsPresent":
			return known == want, nil
		}
		if !known {
			return false, fmt.Errorf("the run does not say what %s is (rule %s)", path, toJSON(rule))
		}
		// A ...Path comparison compares with another path's value.
		cmp := strings.TrimSuffix(op, "Path")
		if cmp != op {
			other, _ := want.(string)
			v, ok := run.value(other)
			if !ok {
				return false, fmt.Errorf("the run does not say what %s is (rule %s)", other, toJSON(rule))
			}
			want = v
		}
		switch cmp {
		case "BooleanEquals", "StringEquals", "NumericEquals", "TimestampEquals":
			return val == want, nil
		case "NumericGreaterThan", "NumericLessThan", "NumericGreaterThanEquals", "NumericLessThanEquals",
			"TimestampGreaterThan", "TimestampLessThan", "TimestampGreaterThanEquals", "TimestampLessThanEquals":
			a, aok := val.(float64)
			b, bok := want.(float64)
			if !aok || !bok {
				return false, fmt.Errorf("rule %s: a timestamp is priced as seconds from the run's start, in the run and the rule alike", toJSON(rule))
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(cmp, "Numeric"), "Timestamp")
			return map[string]bool{"GreaterThan": a > b, "LessThan": a < b,
				"GreaterThanEquals": a >= b, "LessThanEquals": a <= b}[rel], nil
		default:
			return false, fmt.Errorf("comparison %s is not priced", op)
		}
	}
	return false, fmt.Errorf("rule %s compares nothing", toJSON(rule))
}
