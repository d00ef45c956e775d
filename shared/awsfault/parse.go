package awsfault

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads rules written as "Operation:Fault=rate" separated by commas, for example
// "TransactWriteItems:TransactionConflict=0.1,*:Throttling=0.1". "*" or no "Operation:"
// matches any operation.
func Parse(spec string) ([]Rule, error) {
	var rules []Rule
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lhs, rate, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("fault rule %q: want Operation:Fault=rate", part)
		}
		op, name, hasOp := strings.Cut(strings.TrimSpace(lhs), ":")
		if !hasOp {
			op, name = "", op
		}
		op, name = strings.TrimSpace(op), strings.TrimSpace(name)
		if op == "*" {
			op = ""
		}
		f, err := parseFault(name)
		if err != nil {
			return nil, fmt.Errorf("fault rule %q: %w", part, err)
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(rate), 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("fault rule %q: rate must be a number from 0 to 1", part)
		}
		rules = append(rules, Rule{Operation: op, Fault: f, Rate: r})
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("fault spec %q has no rules", spec)
	}
	return rules, nil
}

func parseFault(name string) (Fault, error) {
	for _, f := range faults {
		if string(f) == name {
			return f, nil
		}
	}
	known := make([]string, len(faults))
	for k, f := range faults {
		known[k] = string(f)
	}
	return "", fmt.Errorf("unknown fault %q (known: %s)", name, strings.Join(known, ", "))
}
