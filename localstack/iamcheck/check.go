package iamcheck

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/openrelay/capacity/shared/calllog"
)

// Setup is what the check knows of a stack: its account, tables, roles (with the functions
// that run as each) and resource policies.
type Setup struct {
	Account Account
	Tables  map[string]TableKeys // by table name
	Roles   map[string]Role      // by role ARN
	// Functions maps each Lambda function's name to its role's ARN.
	Functions map[string]string
	// ResourcePolicies holds the statements of each resource's policy, by the resource's ARN.
	ResourcePolicies map[string][]Statement
}

// Role is an IAM role of the template.
type Role struct {
	LogicalID  string
	ARN        string
	Statements []Statement // every identity policy attached to it, inline or not
	// Unmodelled lists attached policies the check cannot read (AWS managed ones): what they
	// allow, the check does not see.
	Unmodelled []string
}

// Finding is a call that the policies do not allow (or that the check cannot decide).
type Finding struct {
	Principal string // the function (or role ARN) that made the call
	Role      string // its role's logical id
	Call      string // "DynamoDB DeleteItem"
	Action    string
	Resource  string
	Reason    string
	Calls     int    // how many distinct logged calls ended here
	Example   string // one call's condition keys
}

func (f Finding) String() string {
	s := fmt.Sprintf("%s (role %s): %s on %s is not allowed: %s [%s, %d distinct call(s)",
		f.Principal, cmp.Or(f.Role, "?"), f.Action, cmp.Or(f.Resource, "?"), f.Reason, f.Call, f.Calls)
	if f.Example != "" {
		s += "; e.g. " + f.Example
	}
	return s + "]"
}

// Check evaluates every call against the setup and returns what is not allowed, sorted.
func Check(s Setup, calls []calllog.Call) []Finding {
	byKey := map[string]*Finding{}
	add := func(f Finding) {
		key := strings.Join([]string{f.Principal, f.Action, f.Resource, f.Reason}, "\x00")
		if prev, ok := byKey[key]; ok {
			prev.Calls++
			return
		}
		f.Calls = 1
		byKey[key] = &f
	}
	for _, c := range calls {
		call := c.Service + " " + c.Operation
		roleARN := c.Principal
		if !strings.HasPrefix(roleARN, "arn:") {
			roleARN = s.Functions[c.Principal]
		}
		role, ok := s.Roles[roleARN]
		if !ok {
			add(Finding{Principal: c.Principal, Call: call, Action: c.Service + ":" + c.Operation,
				Reason: "the template has no role for this principal"})
			continue
		}
		reqs, err := Requests(c, s.Account, s.Tables)
		if err != nil {
			add(Finding{Principal: c.Principal, Role: role.LogicalID, Call: call, Action: c.Service + ":" + c.Operation, Reason: err.Error()})
			continue
		}
		for _, r := range reqs {
			pol := Policies{Identity: role.Statements, Resource: s.ResourcePolicies[r.Resource],
				ResourceMustAllow: strings.HasPrefix(r.Action, "kms:")}
			d := Evaluate(Principal{RoleARN: role.ARN, Account: s.Account.ID}, pol, r)
			if d.Allowed {
				continue
			}
			reason := d.Reason
			if len(role.Unmodelled) > 0 {
				reason += " (not read: " + strings.Join(role.Unmodelled, ", ") + ")"
			}
			add(Finding{Principal: c.Principal, Role: role.LogicalID, Call: call, Action: r.Action, Resource: r.Resource,
				Reason: reason, Example: contextString(r.Context)})
		}
	}
	out := make([]Finding, 0, len(byKey))
	for _, f := range byKey {
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Principal, b.Principal), cmp.Compare(a.Action, b.Action), cmp.Compare(a.Resource, b.Resource))
	})
	return out
}

func contextString(ctx map[string][]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(ctx)) {
		parts = append(parts, k+"="+strings.Join(ctx[k], ","))
	}
	return strings.Join(parts, " ")
}
