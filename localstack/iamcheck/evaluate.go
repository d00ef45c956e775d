package iamcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Request is one authorisation IAM makes for a call: an action on a resource, with the
// condition keys the call brings.
type Request struct {
	Action   string // e.g. "dynamodb:PutItem"
	Resource string // ARN
	// Context holds the request's condition keys and their values (keys compare without
	// regard to case). Known lists the keys (or, ending in ":", key prefixes) the request is
	// complete for: one of them missing from Context is absent from the call, not unmodelled.
	Context map[string][]string
	Known   []string
}

// Principal is who asks: a role and the account it belongs to.
type Principal struct {
	RoleARN string
	Account string
}

// Policies are the statements that decide a request of one principal: its identity
// policies, and the resource policy of the resource (nil if it has none).
type Policies struct {
	Identity []Statement
	Resource []Statement
	// ResourceMustAllow: the resource policy must allow (itself, or through the account's
	// IAM policies), as a KMS key's does.
	ResourceMustAllow bool
}

// Decision is the outcome of Evaluate.
type Decision struct {
	Allowed bool
	Reason  string // why not, or which statement allowed it
}

// Evaluate decides req for p under pol, as IAM does within one account: an explicit Deny
// anywhere wins; else an Allow in the identity or the resource policy allows (both, for a
// resource that must allow).
func Evaluate(p Principal, pol Policies, req Request) Decision {
	ctx := requestContext(p, req)
	var identityAllow, resourceAllow, accountAllow string
	var undecided []string

	check := func(s Statement, resource bool) (deny string) {
		if !s.matchesAction(req.Action) || !s.matchesResource(req.Resource) {
			return ""
		}
		via := directly
		if resource {
			if s.NotPrincipal {
				undecided = append(undecided, name(s)+" (NotPrincipal)")
				return ""
			}
			if via = s.matchesPrincipal(p.RoleARN, p.Account); via == notPrincipal {
				return ""
			}
		}
		holds, missing := conditionsHold(s.Conditions, ctx)
		if missing != "" {
			undecided = append(undecided, fmt.Sprintf("%s (%s not modelled)", name(s), missing))
			if s.Effect == "Deny" {
				return "undecidable " + name(s)
			}
			return ""
		}
		if !holds {
			return ""
		}
		switch {
		case s.Effect == "Deny":
			return name(s)
		case !resource:
			identityAllow = cmpOr(identityAllow, name(s))
		case via == directly:
			resourceAllow = cmpOr(resourceAllow, name(s))
		default:
			accountAllow = cmpOr(accountAllow, name(s))
		}
		return ""
	}
	for _, s := range pol.Identity {
		if d := check(s, false); d != "" {
			return Decision{Reason: "explicitly denied by " + d}
		}
	}
	for _, s := range pol.Resource {
		if d := check(s, true); d != "" {
			return Decision{Reason: "explicitly denied by " + d}
		}
	}
	switch {
	case resourceAllow != "":
		return Decision{Allowed: true, Reason: "allowed by " + resourceAllow}
	case identityAllow != "" && (!pol.ResourceMustAllow || accountAllow != ""):
		return Decision{Allowed: true, Reason: "allowed by " + identityAllow}
	case identityAllow != "":
		return Decision{Reason: "allowed by " + identityAllow + " but the resource policy neither allows it nor delegates to IAM"}
	}
	reason := "no statement allows it"
	if len(undecided) > 0 {
		reason += "; undecidable: " + strings.Join(undecided, ", ")
	}
	return Decision{Reason: reason}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func name(s Statement) string {
	if s.Sid != "" {
		return s.Policy + "/" + s.Sid
	}
	return s.Policy
}

// context is a request's condition keys, lower-cased, with the principal's global keys.
type context struct {
	values map[string][]string
	known  []string
}

func requestContext(p Principal, req Request) context {
	c := context{values: map[string][]string{
		"aws:principalarn":     {p.RoleARN},
		"aws:principalaccount": {p.Account},
		"aws:principaltype":    {"AssumedRole"},
		// The SDK calls AWS over HTTPS.
		"aws:securetransport": {"true"},
	}}
	for k, v := range req.Context {
		c.values[strings.ToLower(k)] = v
	}
	for k := range c.values {
		c.known = append(c.known, k)
	}
	for _, k := range req.Known {
		c.known = append(c.known, strings.ToLower(k))
	}
	return c
}

// modelled reports whether the request is complete for key: present, or declared known.
func (c context) modelled(key string) bool {
	return slices.ContainsFunc(c.known, func(k string) bool {
		return k == key || (strings.HasSuffix(k, ":") && strings.HasPrefix(key, k))
	})
}

// conditionsHold evaluates every condition (all must hold). missing names what the
// evaluator does not model: a condition key the request may carry, or an operator.
func conditionsHold(conds []Condition, ctx context) (holds bool, missing string) {
	for _, c := range conds {
		ok, err := c.holds(ctx)
		if err != "" {
			return false, err
		}
		if !ok {
			return false, ""
		}
	}
	return true, ""
}

func (c Condition) holds(ctx context) (bool, string) {
	key := strings.ToLower(c.Key)
	op := c.Operator
	set := ""
	if q, rest, ok := strings.Cut(op, ":"); ok {
		set, op = q, rest
	}
	ifExists := strings.HasSuffix(op, "IfExists")
	op = strings.TrimSuffix(op, "IfExists")
	if !ctx.modelled(key) {
		return false, "condition key " + c.Key
	}
	vals, present := ctx.values[key]

	if op == "Null" {
		if len(c.Values) != 1 {
			return false, "condition " + c.Operator + " with several values"
		}
		return strings.EqualFold(c.Values[0], "true") != present, ""
	}
	match, negated, ok := operator(op)
	if !ok {
		return false, "condition operator " + c.Operator
	}
	if !present {
		switch {
		case ifExists, set == "ForAllValues":
			return true, ""
		case set == "ForAnyValue":
			return false, ""
		default:
			return negated, ""
		}
	}
	anyValue := func(v string) bool {
		return slices.ContainsFunc(c.Values, func(p string) bool { return match(p, v) })
	}
	switch set {
	case "ForAllValues":
		for _, v := range vals {
			if anyValue(v) == negated {
				return false, ""
			}
		}
		return true, ""
	case "ForAnyValue":
		return slices.ContainsFunc(vals, func(v string) bool { return anyValue(v) != negated }), ""
	case "":
		return slices.ContainsFunc(vals, anyValue) != negated, ""
	}
	return false, "condition operator " + c.Operator
}

// operator returns how a condition operator compares a policy value with a request value.
func operator(op string) (match func(pattern, value string) bool, negated, ok bool) {
	equal := func(p, v string) bool { return p == v }
	fold := strings.EqualFold
	switch op {
	case "StringEquals":
		return equal, false, true
	case "StringNotEquals":
		return equal, true, true
	case "StringEqualsIgnoreCase", "Bool":
		return fold, false, true
	case "StringNotEqualsIgnoreCase":
		return fold, true, true
	case "StringLike", "ArnLike", "ArnEquals": // ArnEquals takes wildcards too
		return wildcard, false, true
	case "StringNotLike", "ArnNotLike", "ArnNotEquals":
		return wildcard, true, true
	}
	return nil, false, false
}
