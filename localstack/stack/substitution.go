package stack

import (
	"fmt"
	"strings"
)

func (r *resolver) sub(arg any) (any, error) {
	var (
		text string
		vars map[string]any
	)

	switch a := arg.(type) {
	case string:
		text = a
	case []any:
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Sub: want string or [string, variables], got %v", arg)
		}

		text, _ = a[0].(string)

		m, ok := a[1].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("Fn::Sub: variables must be a map, got %v", a[1])
		}

		vars = m
	default:
		return nil, fmt.Errorf("Fn::Sub: unexpected argument %v", arg)
	}

	out, err := substitute(text, func(name string) (string, error) {
		if v, ok := vars[name]; ok {
			return r.resolveString(v)
		}

		if id, attr, ok := strings.Cut(name, "."); ok {
			return r.resolveString(map[string]any{"Fn::GetAtt": []any{id, attr}})
		}

		return r.resolveString(map[string]any{"Ref": name})
	})
	if err != nil {
		return nil, fmt.Errorf("Fn::Sub: %w", err)
	}

	return out, nil
}

// substitute replaces ${name} in text using lookup; ${!text} is the literal ${text}.
func substitute(text string, lookup func(string) (string, error)) (string, error) {
	var b strings.Builder

	for {
		start := strings.Index(text, "${")
		if start < 0 {
			b.WriteString(text)

			return b.String(), nil
		}

		end := strings.Index(text[start:], "}")
		if end < 0 {
			b.WriteString(text)

			return b.String(), nil
		}

		end += start
		name := text[start+2 : end]
		b.WriteString(text[:start])

		if lit, ok := strings.CutPrefix(name, "!"); ok {
			b.WriteString("${" + lit + "}")
		} else {
			val, err := lookup(strings.TrimSpace(name))
			if err != nil {
				return "", fmt.Errorf("${%s}: %w", name, err)
			}

			b.WriteString(val)
		}

		text = text[end+1:]
	}
}

// subVariables lists the ${name} references of an Fn::Sub string (not the ${!literals}).
func subVariables(text string) []string {
	var names []string

	_, _ = substitute(text, func(name string) (string, error) {
		names = append(names, name)

		return "", nil
	})

	return names
}
