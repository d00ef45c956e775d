package stack

import (
	"fmt"
	"reflect"
	"slices"
)

func (r *resolver) ifFn(arg any) (any, error) {
	a, ok := arg.([]any)
	if !ok || len(a) != 3 {
		return nil, fmt.Errorf("Fn::If: want [condition, then, else], got %v", arg)
	}

	name, ok := a[0].(string)
	if !ok {
		return nil, fmt.Errorf("Fn::If: condition must be a name, got %v", a[0])
	}

	cond, err := r.condition(name)
	if err != nil {
		return nil, err
	}

	if cond {
		return r.resolve(a[1])
	}

	return r.resolve(a[2])
}

// condition evaluates the named template condition (memoised).
func (r *resolver) condition(name string) (bool, error) {
	if v, ok := r.conditions[name]; ok {
		return v, nil
	}

	def, ok := r.t.Conditions[name]
	if !ok {
		return false, fmt.Errorf("condition %s is not defined", name)
	}

	if r.evaluating[name] {
		return false, fmt.Errorf("condition %s refers to itself", name)
	}

	r.evaluating[name] = true
	defer delete(r.evaluating, name)

	v, err := r.evalCondition(def)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}

	r.conditions[name] = v

	return v, nil
}

func (r *resolver) evalCondition(v any) (bool, error) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		if b, ok := v.(bool); ok {
			return b, nil
		}

		return false, fmt.Errorf("not a condition: %v", v)
	}

	for name, arg := range m {
		switch name {
		case "Condition":
			s, _ := arg.(string)

			return r.condition(s)
		case "Fn::Equals":
			a, ok := arg.([]any)
			if !ok || len(a) != 2 {
				return false, fmt.Errorf("Fn::Equals: want two values, got %v", arg)
			}

			x, err := r.resolve(a[0])
			if err != nil {
				return false, err
			}

			y, err := r.resolve(a[1])
			if err != nil {
				return false, err
			}

			xs, xerr := scalarString(x)
			ys, yerr := scalarString(y)

			if xerr == nil && yerr == nil {
				return xs == ys, nil
			}

			return reflect.DeepEqual(x, y), nil
		case "Fn::And", "Fn::Or":
			a, ok := arg.([]any)
			if !ok {
				return false, fmt.Errorf("%s: want a list, got %v", name, arg)
			}

			results := make([]bool, len(a))

			for i, c := range a {
				b, err := r.evalCondition(c)
				if err != nil {
					return false, err
				}

				results[i] = b
			}

			if name == "Fn::And" {
				return !slices.Contains(results, false), nil
			}

			return slices.Contains(results, true), nil
		case "Fn::Not":
			a, ok := arg.([]any)
			if !ok || len(a) != 1 {
				return false, fmt.Errorf("Fn::Not: want one condition, got %v", arg)
			}

			b, err := r.evalCondition(a[0])

			return !b, err
		}
	}

	return false, fmt.Errorf("not a condition: %v", v)
}
