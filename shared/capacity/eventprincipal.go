package capacity

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// EventPrincipal is who the inbound events of one EventBridge source act as. EventBridge does
// not authenticate an event's source: IAM does (an events:source condition on every PutEvents
// grant and a bus policy that denies the source to every other role), so the source can be
// trusted to name its sender, and a detail field never grants anything.
type EventPrincipal struct {
	// Source is the event's "source".
	Source string `json:"source"`
	// OrgID is the one org the source acts for: a reclaim request's actingOrgId must name it.
	OrgID string `json:"orgId"`
	// Operator, with Permissions, is what an API key of the same org would hold.
	Operator    bool     `json:"operator,omitempty"`
	Permissions []string `json:"permissions"`
}

// Principal is the caller the domain sees for the source's events.
func (e EventPrincipal) Principal() Principal {
	return Principal{KeyID: "event:" + e.Source, OrgID: e.OrgID, Operator: e.Operator, Permissions: slices.Clone(e.Permissions)}
}

// EventPrincipals maps each accepted source to its principal. Nil or empty accepts no event:
// a source absent from it is refused (fail closed).
type EventPrincipals map[string]EventPrincipal

// Lookup returns the principal of source, if it is accepted.
func (ps EventPrincipals) Lookup(source string) (EventPrincipal, bool) {
	p, ok := ps[source]
	return p, ok
}

// eventSourceForm is a custom EventBridge source: "aws." sources are AWS services' own events.
var eventSourceForm = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$`)

// ValidEventSource reports whether s may be configured as an inbound source: a custom source
// that is none of the service's own (what it publishes, and what its schedules put on the bus).
func ValidEventSource(s string) error {
	switch {
	case !eventSourceForm.MatchString(s) || strings.HasPrefix(s, "aws."):
		return fmt.Errorf("%q is not a custom EventBridge source", s)
	case s == SourceCapacity || s == SourceSchedule:
		return fmt.Errorf("%q is the service's own source", s)
	}
	return nil
}

// PermTopology allows an operator to change a node's unit list (Node Topology Changed events).
const PermTopology = "node.topology"

// EventPermissions are the permissions an event principal may hold: what the event intake can
// do. Reclaim requests need PermCapacity; topology changes need Operator and PermTopology.
var EventPermissions = []string{PermCapacity, PermTopology}

// CanChangeTopology reports whether the source's Node Topology Changed events are applied.
func (e EventPrincipal) CanChangeTopology() bool {
	return e.Operator && slices.Contains(e.Permissions, PermTopology)
}

// CanReclaim reports whether the source's Capacity Reclaim Requested events are applied
// (the domain then checks the request as it checks an API key's).
func (e EventPrincipal) CanReclaim() bool { return slices.Contains(e.Permissions, PermCapacity) }

// ValidateEventPrincipals reports every problem of the list: a source twice, a source that is not a custom
// one or is the service's own, an org that is no id, an unknown or missing permission.
func ValidateEventPrincipals(list []EventPrincipal) error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range list {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("event principal %d (%s): %s", i, p.Source, fmt.Sprintf(format, a...)))
		}
		if err := ValidEventSource(p.Source); err != nil {
			bad("source: %v", err)
		}
		if seen[p.Source] {
			bad("source listed twice: a source maps to exactly one principal")
		}
		seen[p.Source] = true
		if !ValidID(p.OrgID) {
			bad("orgId %q is not an org id", p.OrgID)
		}
		if len(p.Permissions) == 0 {
			bad("grants nothing: name its permissions")
		}
		if slices.Contains(p.Permissions, PermTopology) && !p.Operator {
			bad("%s is an operator permission: set operator", PermTopology)
		}
		for _, perm := range p.Permissions {
			if !slices.Contains(EventPermissions, perm) {
				bad("permission %q: an event may hold only %s", perm, strings.Join(EventPermissions, ", "))
			}
		}
	}
	return errors.Join(errs...)
}

// ParseEventPrincipals reads the JSON list the stack gives the event intake (the cdk.json
// eventPrincipals less their IAM roles), strictly: an unknown member or an invalid entry is an
// error, so a typo refuses to start instead of widening or narrowing who may act.
func ParseEventPrincipals(data string) (EventPrincipals, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(data)))
	dec.DisallowUnknownFields()
	var list []EventPrincipal
	if err := dec.Decode(&list); err != nil {
		return nil, fmt.Errorf("event principals: want a JSON list of {source, orgId, operator, permissions}: %w", err)
	}
	if err := ValidateEventPrincipals(list); err != nil {
		return nil, err
	}
	out := make(EventPrincipals, len(list))
	for _, p := range list {
		out[p.Source] = p
	}
	return out, nil
}
