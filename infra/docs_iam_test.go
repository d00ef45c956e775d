package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/table"
)

// The IAM table of docs/architecture.md ("Data") lists, one row per role and resource, the
// actions each role of the stack may take. TestIAMDocMatchesRoles holds it to the synthesised
// roles both ways, so the docs cannot promise less (or more) than the stack grants.

// iamRow is one row of the table: a role's actions on one resource.
type iamRow struct{ role, resource string }

// Roles in the table besides the functions' (named as their function): every function's
// common grants, the workflow's and EventBridge Scheduler's. The floor exists in env local only.
const (
	everyFunction = "every function"
	workflowRole  = "termination workflow"
	schedulerRole = "scheduler"
	floorRole     = "floor (local only)"
)

// docIAMTable parses the table under the header "| role | resource | actions | why |".
func docIAMTable(t *testing.T) map[iamRow][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	start := slices.Index(lines, "| role | resource | actions | why |")
	if start < 0 {
		t.Fatal("docs/architecture.md has no IAM table (header | role | resource | actions | why |)")
	}
	out := map[iamRow][]string{}
	for _, line := range lines[start+2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("docs IAM row %q: want 4 cells", line)
		}
		row := iamRow{strings.TrimSpace(cells[0]), strings.Trim(strings.TrimSpace(cells[1]), "`")}
		if _, dup := out[row]; dup {
			t.Errorf("docs IAM table: %s on %s twice", row.role, row.resource)
		}
		var actions []string
		for _, a := range strings.Split(cells[2], ",") {
			actions = append(actions, strings.Trim(strings.TrimSpace(a), "`"))
		}
		sort.Strings(actions)
		out[row] = actions
	}
	return out
}

// resourceNames names the resources roles are granted on, as the docs call them, by their
// JSON in the template (rolePermissions' keys, before any condition).
func resourceNames(t *testing.T, tp tmpl, env string) map[string]string {
	t.Helper()
	names := map[string]string{`"*"`: "*"}
	join := func(parts ...any) string { return toJSON(map[string]any{"Fn::Join": []any{"", parts}}) }
	for _, spec := range table.All {
		id := tableID(t, tp, spec, env)
		name := strings.ToLower(strings.TrimSuffix(spec.LogicalID, "Table")) + " table"
		names[toJSON(getAtt(id, "Arn"))] = name
		for _, ix := range spec.Indexes {
			names[join(getAtt(id, "Arn"), "/index/"+ix.Name)] = name + " " + ix.Name + " index"
		}
	}
	names[toJSON(ref(agentMasterSecretID(t, tp, env)))] = "agent master secret"
	names[toJSON(getAtt(agentKeysKeyID(t, tp), "Arn"))] = "agent keys KMS key"
	sm := stateMachineID(t, tp, env)
	names[toJSON(ref(sm))] = "termination workflow"
	names[toJSON(getAtt(eventBusID(t, tp, env), "Arn"))] = "event bus"
	names[toJSON(getAtt(queueID(t, tp, "capacity-"+env+"-reclaim-requests"), "Arn"))] = "reclaim requests queue"
	names[toJSON(getAtt(queueID(t, tp, "capacity-"+env+"-termination-steps"), "Arn"))] = "termination steps queue"
	names[join("arn:", ref("AWS::Partition"), ":scheduler:", ref("AWS::Region"), ":", ref("AWS::AccountId"),
		":schedule/capacity-"+env+"/*")] = "schedules of the group"
	names[toJSON(getAtt(schedulerRoleID(t, tp, env), "Arn"))] = "scheduler role"
	for _, fn := range []string{"terminate-node", "operation-events"} {
		id, _ := functionByName(t, tp, env, fn)
		names[toJSON(getAtt(id, "Arn"))] = fn + " function"
		names[join(getAtt(id, "Arn"), ":*")] = fn + " function versions"
	}
	return names
}

// synthesisedIAM is what the roles of env's stack may do, as rows of the docs' table: a resource named by
// resourceNames, followed by ", if " and the condition keys when the grant is conditioned,
// after "denied: " for a role's explicit Deny; a
// function's own log group is "own log group". Every function's common grants (its own log
// group, X-Ray) are checked here and left out, for the table's "every function" rows.
func synthesisedIAM(t *testing.T, tp tmpl, env string, common map[string][]string) map[iamRow][]string {
	t.Helper()
	names := resourceNames(t, tp, env)
	name := func(key, ownLogs string) string {
		res, cond, conditioned := strings.Cut(key, " if ")
		res, denied := strings.CutPrefix(res, "deny ")
		n, ok := names[res]
		if res == ownLogs {
			n, ok = "own log group", true
		}
		if !ok {
			t.Errorf("resource %s has no name in the docs' terms: add it to resourceNames", res)
			n = res
		}
		if conditioned {
			n += ", if " + strings.Join(conditionKeys(t, cond), ", ")
		}
		if denied {
			n = "denied: " + n
		}
		return n
	}
	out := map[iamRow][]string{}
	starOK := slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)
	fns := []string{"api", "terminate-node", "reconciler", "reclaim-events", "operation-events", "termination-steps"}
	if env == "local" {
		fns = append(fns, "floor")
	}
	for _, fn := range fns {
		_, r := functionByName(t, tp, env, fn)
		ownLogs := toJSON(getAtt(logGroupID(t, tp, "/aws/lambda/capacity-"+env+"-"+fn), "Arn"))
		role := fn
		if fn == "floor" {
			role = floorRole
		}
		has := map[string]bool{}
		for key, actions := range rolePermissions(t, tp, roleOf(t, r, "Role"), "lambda.amazonaws.com", starOK...) {
			row := iamRow{role, name(key, ownLogs)}
			if want, ok := common[row.resource]; ok && slices.Equal(actions, want) {
				has[row.resource] = true // an "every function" row
				continue
			}
			out[row] = actions
		}
		for res := range common {
			if !has[res] {
				t.Errorf("function %s lacks the grants of the docs' %q row on %s", fn, everyFunction, res)
			}
		}
	}
	_, sm := tp.one(t, "AWS::StepFunctions::StateMachine", "StateMachineName", "capacity-"+env+"-termination-express")
	for key, actions := range rolePermissions(t, tp, roleOf(t, sm, "RoleArn"), "states.amazonaws.com", starOK...) {
		out[iamRow{workflowRole, name(key, "")}] = actions
	}
	sched := schedulerRoleID(t, tp, env)
	for key, actions := range rolePermissions(t, tp, sched, "scheduler.amazonaws.com") {
		out[iamRow{schedulerRole, name(key, "")}] = actions
	}
	return out
}

// conditionKeys are the condition keys a statement's condition (JSON) tests, sorted.
func conditionKeys(t *testing.T, cond string) []string {
	var c map[string]map[string]any // operator -> key -> value(s)
	if err := json.Unmarshal([]byte(cond), &c); err != nil {
		t.Fatalf("condition %s: %v", cond, err)
	}
	var keys []string
	for _, byKey := range c {
		for k := range byKey {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return slices.Compact(keys)
}

// TestIAMDocMatchesRoles: every row of the IAM table of docs/architecture.md is a grant of the
// synthesised stack, with exactly its actions, and every grant of every role is a row.
func TestIAMDocMatchesRoles(t *testing.T) {
	doc := docIAMTable(t)
	common := map[string][]string{}
	for row, actions := range doc {
		if row.role == everyFunction {
			common[row.resource] = actions
		}
	}
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			got := synthesisedIAM(t, tp, env, common)
			var missing, wrong []string
			for row, actions := range got {
				want, ok := doc[row]
				switch {
				case !ok:
					missing = append(missing, fmt.Sprintf("| %s | %s | `%s` | |", row.role, row.resource, strings.Join(actions, "`, `")))
				case !slices.Equal(want, actions):
					wrong = append(wrong, fmt.Sprintf("%s on %s: docs %v, stack %v", row.role, row.resource, want, actions))
				}
			}
			for row := range doc {
				if _, ok := got[row]; !ok && row.role != everyFunction && (env == "local" || row.role != floorRole) {
					wrong = append(wrong, fmt.Sprintf("%s on %s: in the docs, not in the stack", row.role, row.resource))
				}
			}
			sort.Strings(missing)
			sort.Strings(wrong)
			if len(missing) > 0 {
				t.Errorf("grants of the stack missing from the IAM table of docs/architecture.md:\n%s", strings.Join(missing, "\n"))
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}
