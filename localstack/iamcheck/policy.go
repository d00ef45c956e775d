// Package iamcheck decides whether IAM policies allow a request, and checks every AWS call
// the local stack's functions made (shared/calllog) against the policies of the synthesised
// template: the emulator enforces no IAM, so without it a call the code makes but no role
// allows would pass every local test and fail with AccessDenied on AWS.
//
// What the evaluator models: identity policies (a role's inline and attached policies from
// the template) and resource policies (a KMS key's, an event bus's, a queue's), Allow and
// explicit Deny, Action and NotAction with wildcards, Resource and NotResource ARN patterns,
// Principal (an ARN, the account, "*"), and the condition operators String*, Arn*, Bool and
// Null with ForAllValues/ForAnyValue and IfExists, on the condition keys the request carries
// (see Request.Context). For a KMS key the key policy must allow, itself or by delegating to
// the account's IAM policies (its account-root statement).
//
// What it does not model, so a call it allows may still be refused on AWS: service control
// policies, permission boundaries, session policies, AWS managed policies (only named), grants
// and VPC endpoint policies, NotPrincipal, numeric and date conditions, policy variables, and
// any condition key a request does not carry (a statement that needs one is reported as
// undecidable rather than guessed).
package iamcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Statement is one statement of a policy document.
type Statement struct {
	Sid                   string
	Effect                string // "Allow" or "Deny"
	Action, NotAction     []string
	Resource, NotResource []string
	Principals            []string // resource policies: "*", an ARN or an account id (Principal.AWS); "service:<name>" for Principal.Service
	NotPrincipal          bool     // present: not modelled
	Conditions            []Condition
	Policy                string // the policy it comes from, for messages
}

// Condition is one test of a Condition block: operator, key and values.
type Condition struct {
	Operator string // as written, e.g. "ForAllValues:StringLike"
	Key      string
	Values   []string
}

// ParseDocument reads a policy document (resolved JSON: map[string]any) named name.
func ParseDocument(name string, doc any) ([]Statement, error) {
	m, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("policy %s: want an object, got %T", name, doc)
	}
	var raw []any
	switch st := m["Statement"].(type) {
	case []any:
		raw = st
	case map[string]any:
		raw = []any{st}
	default:
		return nil, fmt.Errorf("policy %s: no Statement", name)
	}
	out := make([]Statement, 0, len(raw))
	for i, r := range raw {
		s, err := parseStatement(name, r)
		if err != nil {
			return nil, fmt.Errorf("policy %s statement %d: %w", name, i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseStatement(policy string, raw any) (Statement, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return Statement{}, fmt.Errorf("want an object, got %T", raw)
	}
	s := Statement{Policy: policy}
	s.Sid, _ = m["Sid"].(string)
	s.Effect, _ = m["Effect"].(string)
	if s.Effect != "Allow" && s.Effect != "Deny" {
		return Statement{}, fmt.Errorf("effect %q", m["Effect"])
	}
	var err error
	for _, f := range []struct {
		key string
		dst *[]string
	}{{"Action", &s.Action}, {"NotAction", &s.NotAction}, {"Resource", &s.Resource}, {"NotResource", &s.NotResource}} {
		if *f.dst, err = stringList(m[f.key]); err != nil {
			return Statement{}, fmt.Errorf("%s: %w", f.key, err)
		}
	}
	if s.Principals, err = principals(m["Principal"]); err != nil {
		return Statement{}, fmt.Errorf("Principal: %w", err)
	}
	_, s.NotPrincipal = m["NotPrincipal"]
	if c, ok := m["Condition"].(map[string]any); ok {
		for op, tests := range c {
			tm, ok := tests.(map[string]any)
			if !ok {
				return Statement{}, fmt.Errorf("Condition %s: want an object", op)
			}
			for key, v := range tm {
				vals, err := stringList(v)
				if err != nil {
					return Statement{}, fmt.Errorf("Condition %s %s: %w", op, key, err)
				}
				s.Conditions = append(s.Conditions, Condition{Operator: op, Key: key, Values: vals})
			}
		}
		slices.SortFunc(s.Conditions, func(a, b Condition) int { return strings.Compare(a.Operator+a.Key, b.Operator+b.Key) })
	}
	return s, nil
}

func principals(v any) ([]string, error) {
	switch p := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{p}, nil
	case map[string]any:
		var out []string
		for kind, ids := range p {
			list, err := stringList(ids)
			if err != nil {
				return nil, err
			}
			for _, id := range list {
				if kind != "AWS" {
					id = strings.ToLower(kind) + ":" + id
				}
				out = append(out, id)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected %T", v)
}

// stringList reads a string or a list of strings (numbers and booleans as JSON writes them).
func stringList(v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{x}, nil
	case bool, float64, int:
		return []string{fmt.Sprint(x)}, nil
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			l, err := stringList(e)
			if err != nil || len(l) != 1 {
				return nil, fmt.Errorf("want a list of strings, got %v", v)
			}
			out = append(out, l[0])
		}
		return out, nil
	case []string:
		return x, nil
	}
	return nil, fmt.Errorf("want a string or a list, got %T", v)
}

// matchesAction reports whether the statement's Action (or NotAction) covers action. Actions
// compare without regard to case.
func (s Statement) matchesAction(action string) bool {
	if len(s.NotAction) > 0 {
		return !slices.ContainsFunc(s.NotAction, func(p string) bool { return wildcard(strings.ToLower(p), strings.ToLower(action)) })
	}
	return slices.ContainsFunc(s.Action, func(p string) bool { return wildcard(strings.ToLower(p), strings.ToLower(action)) })
}

// matchesResource reports whether the statement's Resource (or NotResource) covers arn. A
// resource policy without either covers its own resource.
func (s Statement) matchesResource(arn string) bool {
	if len(s.NotResource) > 0 {
		return !slices.ContainsFunc(s.NotResource, func(p string) bool { return wildcard(p, arn) })
	}
	if len(s.Resource) == 0 {
		return true
	}
	return slices.ContainsFunc(s.Resource, func(p string) bool { return wildcard(p, arn) })
}

// principalMatch says how a resource policy statement names the caller: directly (its role
// ARN, or "*"), through its account (the root: the account's IAM policies decide), or not.
type principalMatch int

const (
	notPrincipal principalMatch = iota
	viaAccount
	directly
)

func (s Statement) matchesPrincipal(roleARN, account string) principalMatch {
	best := notPrincipal
	for _, p := range s.Principals {
		switch {
		case p == "*" || p == roleARN:
			return directly
		case p == account || p == "arn:aws:iam::"+account+":root" || strings.HasSuffix(p, ":iam::"+account+":root"):
			best = viaAccount
		}
	}
	return best
}

// wildcard matches IAM patterns: * any run of characters (":" and "/" included), ? one.
func wildcard(pattern, s string) bool {
	if !strings.ContainsAny(pattern, "*?") {
		return pattern == s
	}
	// Not path.Match: its * stops at "/", IAM's does not.
	parts := strings.Split(pattern, "*")
	if !globPrefix(parts[0], s) {
		return false
	}
	s = s[len(parts[0]):]
	if len(parts) == 1 {
		return s == ""
	}
	last := parts[len(parts)-1]
	for _, part := range parts[1 : len(parts)-1] {
		i := indexGlob(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return len(s) >= len(last) && globPrefix(last, s[len(s)-len(last):])
}

// globPrefix: s starts with p, where ? in p matches any one character.
func globPrefix(p, s string) bool {
	if len(s) < len(p) {
		return false
	}
	for i := range len(p) {
		if p[i] != '?' && p[i] != s[i] {
			return false
		}
	}
	return true
}

func indexGlob(s, p string) int {
	for i := 0; i+len(p) <= len(s); i++ {
		if globPrefix(p, s[i:]) {
			return i
		}
	}
	return -1
}
