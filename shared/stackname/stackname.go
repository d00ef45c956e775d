// Package stackname is the one home of the names the stack gives itself and its resources:
// capacity-<env> for the stack (and its bus, schedule group and dashboard), and
// capacity-<env>-<what> for the rest: a function by its folder under functions/
// (capacity-prod-api, whose logs go to /aws/lambda/capacity-prod-api), a table by its suffix,
// the queue, the state machine, the alarms. infra names what it creates by it; the tables'
// description and the local stack's invoke command find them by it. It imports only the
// standard library, so that infra may import it.
package stackname

// Project is the first word of every name, and the stack's "project" tag.
const Project = "capacity"

// Stack is the stack's name in env, e.g. capacity-prod.
func Stack(env string) string { return Project + "-" + env }

// Resource is the name of the stack's resource what in env, e.g. capacity-prod-termination.
func Resource(env, what string) string { return Stack(env) + "-" + what }

// Function is the name of the function fn (its folder under functions/, as envvar.Function
// names it) in env, e.g. capacity-prod-terminate-node.
func Function(env, fn string) string { return Resource(env, fn) }
