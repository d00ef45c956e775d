package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/stackoutput"
)

// Exit codes (docs/operating.md).
const (
	exitOK          = 0
	exitFailed      = 1 // the call failed, was refused or not confirmed; audit verify found a problem
	exitUsage       = 2
	exitPlanChanged = 3 // reclaim: the plan changed between the dry run and the real call
	exitVMsFailed   = 4 // reclaim: some evicted VM's termination failed
	exitWaitExpired = 5 // reclaim --wait, reclaims wait: the wait ran out with the operation still running
)

// defaultOutputsFile is where the local stack (make run) writes its outputs.
const defaultOutputsFile = ".local/outputs.json"

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// app is one invocation: the global settings and what was resolved from them.
type app struct {
	io     stdio
	getenv func(string) string

	endpoint, key, output, outputsFile, stack string
	timeout                                   time.Duration

	// pollEvery is how often reclaim follows its operation; tests shorten it.
	pollEvery time.Duration
	// httpClient, when set, replaces the default transport (tests).
	httpClient *http.Client
	// awsConfig, when set, replaces the AWS configuration (tests).
	awsConfig func(ctx context.Context) (aws.Config, error)
	// describeStack reads a stack's outputs; tests replace it.
	describeStack func(ctx context.Context, cfg aws.Config, name string) (map[string]string, error)

	outputs map[string]string // resolved lazily

	// now is the clock the waiters count the grace and --wait with; tests set it.
	now func() time.Time
	// liveOut and liveErr are stdout and stderr as given, unescaped, when they are terminals
	// (nil otherwise): the waiters redraw their countdown there. Only capacityctl's own text
	// goes through them.
	liveOut, liveErr io.Writer
	// cmd is the command running; target names what it acts on (for the next command to
	// suggest after a refusal).
	cmd    *command
	target target
}

// exitError carries an exit code; usage errors also print the command's usage.
type exitError struct {
	code  int
	err   error
	usage func() // nil: none
	// problem is the code of the problem document printed under --output json ("": by exit
	// code); shown means the command already printed its JSON answer, which says it all.
	problem string
	shown   bool
	// next is the command to run next ("": none known).
	next string
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func usageErr(fs *flag.FlagSet, format string, args ...any) error {
	e := &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
	if fs != nil {
		e.usage = fs.Usage
	}
	return e
}

func failed(code int, err error) error { return &exitError{code: code, err: err} }

// command is one `<group> <verb>` (verb "" for a group that is one command: reclaim, release).
type command struct {
	group, verb, args, help string
	run                     func(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error
	examples                []string
}

func (c command) name() string { return strings.TrimSpace(c.group + " " + c.verb) }

// groups says what each group is for, in the order help lists them.
var groups = []struct{ name, help string }{
	{"keys", "API keys"},
	{"nodes", "list nodes, describe one (its unit map), register, read, rotate the agent's key"},
	{"topology", "a node's unit list"},
	{"reservations", "reservations of a node's units"},
	{"release", "put idle exclusive units of a reservation on the spot market"},
	{"vms", "VM placements (the marketplace scheduler)"},
	{"reclaim", "take units back from the spot market: dry run, now, or scheduled (--at)"},
	{"reclaims", "reclaim operations: the termination of the VMs a reclaim evicted"},
	{"scheduled", "reclaims scheduled for later"},
	{"audit", "the audit trail and its hash chains"},
	{"whoami", "the API key you call with and what it may do"},
	{"completion", "shell completion scripts"},
	{"version", "capacityctl's version and the API it talks to"},
}

// commands is every command. Help, completion, the group listing and the next command after
// a refusal are all read from it: a new command (nodes describe, reclaims list) is one row here
// and its function, nothing else.
func commands() []command {
	return []command{
		{"keys", "create", "--org ORG [--permissions P,...] [--operator] [--expires TIME] [--description TEXT] [--bootstrap]", "create an API key (prints its secret once); --bootstrap writes the first operator key with AWS credentials", keysCreate,
			[]string{"capacityctl keys create --bootstrap --org org-platform --description 'platform on-call'",
				"capacityctl keys create --org org-acme --permissions reservation.capacity,reservation.read --expires 2160h"}},
		{"keys", "list", "[--limit N] [--cursor C]", "list API keys", keysList, []string{"capacityctl keys list --limit 100"}},
		{"keys", "revoke", "KEY_ID [--reason TEXT]", "revoke an API key", keysRevoke, []string{"capacityctl keys revoke key-01hx --reason 'bootstrap done'"}},
		{"nodes", "list", "[--states] [--all] [--limit N] [--cursor C]", "list the nodes you may see: owner (where shown), units; --states adds a strip of their unit states", nodesList,
			[]string{"capacityctl nodes list", "capacityctl nodes list --states --all", "capacityctl -o json nodes list --all"}},
		{"nodes", "describe", "--node N", "the unit map: each unit's state, reservation and VM (id, tier, state, age), as far as you may see them", nodesDescribe,
			[]string{"capacityctl nodes describe --node node-1", "capacityctl -o json nodes describe --node node-1"}},
		{"nodes", "put", "--node N --owner ORG --units U,... --agent-endpoint URL [--reason TEXT]", "register or update a node (a new node's agent key, or a new owner's, is printed once)", nodesPut,
			[]string{"capacityctl nodes put --node node-1 --owner org-acme --units gpu-0,gpu-1,gpu-2,gpu-3 --agent-endpoint https://node-1.agents.example.com"}},
		{"nodes", "rotate-key", "--node N [--reason TEXT]", "give the node's agent a new key (printed once; the previous one works 10 more minutes)", nodesRotateKey,
			[]string{"capacityctl nodes rotate-key --node node-1 --reason 'agent host replaced'"}},
		{"nodes", "end-overlap", "--node N [--reason TEXT]", "stop using the node agent's previous key now, before its 10 minutes are over (after a leak of it)", nodesEndOverlap,
			[]string{"capacityctl nodes end-overlap --node node-1 --reason 'old key leaked'"}},
		{"nodes", "get", "--node N", "show a node", nodesGet, []string{"capacityctl nodes get --node node-1", "capacityctl -o json nodes get --node node-1"}},
		{"reservations", "create", "--node N --units U,... --allowed-orgs O,... [--managing-orgs O,...] [--id ID] [--status active|pending] [--starts TIME] [--ends TIME] [--contract REF] [--reason TEXT]", "create a reservation", reservationsCreate,
			[]string{"capacityctl reservations create --node node-1 --id res-acme --units gpu-0,gpu-1,gpu-2 --allowed-orgs org-acme --managing-orgs org-acme --ends 2027-01-01T00:00:00Z"}},
		{"reservations", "list", "--node N [--limit N] [--cursor C]", "list a node's reservations", reservationsList, []string{"capacityctl reservations list --node node-1"}},
		{"reservations", "get", "--node N --reservation R", "show a reservation", reservationsGet, []string{"capacityctl reservations get --node node-1 --reservation res-acme"}},
		{"reservations", "cancel", "--node N --reservation R [--reason TEXT]", "cancel a reservation and its pending scheduled reclaims (terminates nothing; lists the VMs on its units)", reservationsCancel,
			[]string{"capacityctl reservations cancel --node node-1 --reservation res-acme --reason 'contract ended'"}},
		{"reservations", "reaffirm", "--node N --reservation R [--reason TEXT]", "move a needs-review reservation back to active at the node's topology", reservationsReaffirm,
			[]string{"capacityctl reservations reaffirm --node node-1 --reservation res-acme --reason 'units checked'"}},
		{"topology", "set", "--node N --units U,... [--expected-gen N] [--reason TEXT]", "set a node's unit list (its reservations go to needs-review)", topologySet,
			[]string{"capacityctl topology set --node node-1 --units gpu-0,gpu-1,gpu-2,gpu-3,gpu-4 --expected-gen 1 --reason 'added gpu-4'"}},
		{"release", "", "--node N --reservation R --units U,... [--reason TEXT]", "put idle exclusive units of a reservation on the spot market", releaseCmd,
			[]string{"capacityctl release --node node-1 --reservation res-acme --units gpu-1 --reason 'idle until Monday'"}},
		{"vms", "place", "--node N --vm VM --org ORG --tier spot|reserved|on-demand --units U,...", "record a VM placement (operator with vm.place: the marketplace scheduler)", vmsPlace,
			[]string{"capacityctl vms place --node node-1 --vm vm-spot-7 --org org-buyer --tier spot --units gpu-1"}},
		{"reclaim", "", "--node N --reservation R (--units U,... | --count N) [--reason TEXT] [--grace SECONDS] [--dry-run | --at TIME | [--yes] [--wait D] [--idempotency-key K]]", "dry-run, confirm, reclaim with If-Match, then follow the termination; --dry-run only shows the plan; --at schedules it (--idempotency-key resumes an interrupted reclaim)", reclaimCmd,
			[]string{"capacityctl reclaim --dry-run --node node-1 --reservation res-acme --units gpu-1",
				"capacityctl reclaim --node node-1 --reservation res-acme --units gpu-1 --reason 'training run' --grace 30",
				"capacityctl reclaim --node node-1 --reservation res-acme --count 2 --yes --wait 5m",
				"capacityctl reclaim --node node-1 --reservation res-acme --units gpu-1 --at 2026-12-24T02:00:00Z --reason 'night batch'"}},
		{"reclaims", "list", "--node N --reservation R [--state in-flight|failed|completed] [--limit N] [--cursor C]", "list a reservation's reclaim operations, newest first: state, units, VMs terminated/failed/total, reason", reclaimsList,
			[]string{"capacityctl reclaims list --node node-1 --reservation res-acme", "capacityctl reclaims list --node node-1 --reservation res-acme --state failed --limit 10"}},
		{"reclaims", "get", "--node N --reservation R --reclaim ID", "show a reclaim operation: each evicted VM, its notice and its outcome", reclaimsGet,
			[]string{"capacityctl reclaims get --node node-1 --reservation res-acme --reclaim rcl_01hx"}},
		{"reclaims", "wait", "--node N --reservation R --reclaim ID [--wait D]", "follow a reclaim operation until every VM has an outcome (exit 5 if --wait runs out first)", reclaimsWait,
			[]string{"capacityctl reclaims wait --node node-1 --reservation res-acme --reclaim rcl_01hx --wait 10m"}},
		{"reclaims", "retry", "--node N --reservation R --reclaim ID [--wait D]", "re-drive an ended operation: terminate its VMs not yet terminated or gone again", reclaimsRetry,
			[]string{"capacityctl reclaims retry --node node-1 --reservation res-acme --reclaim rcl_01hx --wait 5m"}},
		{"reclaims", "force-end", "--node N --reservation R --reclaim ID --vm VM --reason TEXT", "end the termination of a VM of a failed operation, confirmed gone out of band (operator with node.manage)", reclaimsForceEnd,
			[]string{"capacityctl reclaims force-end --node node-1 --reservation res-acme --reclaim rcl_01hx --vm vm-spot-7 --reason 'node wiped, ticket OPS-1234'"}},
		{"scheduled", "list", "--node N --reservation R [--limit N] [--cursor C]", "list a reservation's scheduled reclaims in order of at: pending, and fired or cancelled ones until their retention ends", scheduledList,
			[]string{"capacityctl scheduled list --node node-1 --reservation res-acme"}},
		{"scheduled", "get", "--node N --reservation R --id ID", "show a scheduled reclaim: pending, or how it ended", scheduledGet,
			[]string{"capacityctl scheduled get --node node-1 --reservation res-acme --id srcl_01hx"}},
		{"scheduled", "cancel", "--node N --reservation R --id ID", "cancel a pending scheduled reclaim (repeat-safe)", scheduledCancel,
			[]string{"capacityctl scheduled cancel --node node-1 --reservation res-acme --id srcl_01hx"}},
		{"audit", "list", "--node N [--reservation R] | --keys [--limit N] [--cursor C]", "list audit records", auditList,
			[]string{"capacityctl audit list --node node-1", "capacityctl audit list --node node-1 --reservation res-acme", "capacityctl audit list --keys"}},
		{"audit", "verify", "--node N | --keys", "verify an audit hash chain; names the first altered, inserted or removed record", auditVerify,
			[]string{"capacityctl audit verify --node node-1", "capacityctl -o json audit verify --keys"}},
		{"whoami", "", "", "show the API key you call with: its org, permissions, operator or not, expiry and own rate limit (any key may ask)", whoamiCmd,
			[]string{"capacityctl whoami", "capacityctl -o json whoami"}},
		{"completion", "", "bash|zsh|fish", "print a shell completion script (groups, verbs and flags)", completionCmd,
			[]string{"source <(capacityctl completion bash)", "capacityctl completion zsh > \"${fpath[1]}/_capacityctl\"", "capacityctl completion fish > ~/.config/fish/completions/capacityctl.fish"}},
		{"version", "", "", "print capacityctl's version (module, VCS revision) and the API it would talk to (no request is made)", versionCmd,
			[]string{"capacityctl version", "capacityctl --stack capacity-dev -o json version"}},
	}
}

func run(ctx context.Context, args []string, std stdio, getenv func(string) string) int {
	a := &app{io: std, getenv: getenv, pollEvery: time.Second}
	if terminal(os.Stdout) {
		a.liveOut = std.out
	}
	if terminal(os.Stderr) {
		a.liveErr = std.err
	}
	return a.main(ctx, args)
}

// terminal reports whether f is a terminal (a character device), where a line may be redrawn.
func terminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// liveFor is the unescaped writer under w (one of the app's two) when it is a terminal, else nil.
func (a *app) liveFor(w io.Writer) io.Writer {
	switch w {
	case a.io.out:
		return a.liveOut
	case a.io.err:
		return a.liveErr
	}
	return nil
}

func (a *app) main(ctx context.Context, args []string) int {
	a.io.out, a.io.err = &termSafe{w: a.io.out}, &termSafe{w: a.io.err}
	if a.now == nil {
		a.now = time.Now
	}
	global := flag.NewFlagSet("capacityctl", flag.ContinueOnError)
	global.SetOutput(io.Discard) // its errors are reported below, with the usage
	a.globalFlags(global)
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			a.usage(a.io.out)
			return exitOK
		}
		return a.report(&exitError{code: exitUsage, err: err, usage: func() { a.usage(a.io.err) }})
	}
	rest := global.Args()
	if len(rest) == 0 {
		return a.report(&exitError{code: exitUsage, err: errors.New("name a command (capacityctl help lists them)"), usage: func() { a.usage(a.io.err) }})
	}
	if rest[0] == "help" { // help [group [verb]]
		if len(rest) == 1 {
			a.usage(a.io.out)
			return exitOK
		}
		rest = append(rest[1:], "--help")
	}
	cmd, rest, ok := a.find(rest)
	if !ok {
		if verbs := groupCommands(rest[0]); len(verbs) > 0 {
			// A group alone, or with --help: its verbs. Anything else is not a command.
			if len(rest) == 2 && isHelp(rest[1]) {
				a.groupUsage(a.io.out, rest[0])
				return exitOK
			}
			what := fmt.Errorf("%s needs a verb: one of %s", rest[0], strings.Join(verbNames(verbs), ", "))
			if len(rest) > 1 {
				what = fmt.Errorf("unknown command %q", strings.Join(rest[:2], " "))
			}
			return a.report(&exitError{code: exitUsage, err: what, usage: func() { a.groupUsage(a.io.err, rest[0]) }})
		}
		named := rest
		if len(named) > 1 && isHelp(named[len(named)-1]) {
			named = named[:len(named)-1] // help nosuch, nosuch --help
		}
		return a.report(&exitError{code: exitUsage, err: fmt.Errorf("unknown command %q", strings.Join(named, " ")), usage: func() { a.usage(a.io.err) }})
	}
	a.cmd = &cmd
	fs := flag.NewFlagSet("capacityctl "+cmd.name(), flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports its errors, with the usage
	a.globalFlags(fs)        // global flags may follow the command too
	fs.Usage = func() { a.commandUsage(a.io.err, cmd, fs) }
	err := cmd.run(ctx, a, fs, rest)
	return a.report(err)
}

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// find picks the command named by args and returns the rest.
func (a *app) find(args []string) (command, []string, bool) {
	for _, c := range commands() {
		if c.verb == "" && args[0] == c.group {
			return c, args[1:], true
		}
		if len(args) >= 2 && args[0] == c.group && args[1] == c.verb {
			return c, args[2:], true
		}
	}
	return command{}, args, false
}

// groupCommands are the commands of a group that has verbs.
func groupCommands(group string) []command {
	var out []command
	for _, c := range commands() {
		if c.group == group && c.verb != "" {
			out = append(out, c)
		}
	}
	return out
}

func verbNames(cmds []command) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.verb
	}
	return out
}

// usage is capacityctl's help: every command, the global flags and the exit codes. Asked
// for (help, -h), it goes to stdout; after a usage error, to stderr.
func (a *app) usage(w io.Writer) {
	fmt.Fprintln(w, "capacityctl operates the capacity service: keys, nodes, reservations, releases, placements, reclaims and the audit trail.")
	fmt.Fprintln(w, "\nusage: capacityctl [global flags] <group> <verb> [flags]")
	fmt.Fprintln(w, "       capacityctl help [<group> [<verb>]]    capacityctl <group> [<verb>] --help")
	fmt.Fprintln(w, "\ncommands:")
	tw := newTable(w)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name(), c.help)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nexamples:")
	for _, ex := range []string{
		"capacityctl nodes describe --node node-1",
		"capacityctl reservations list --node node-1",
		"capacityctl reclaim --dry-run --node node-1 --reservation res-acme --units gpu-1",
		"capacityctl reclaims wait --node node-1 --reservation res-acme --reclaim rcl_01hx",
		"capacityctl help reclaim",
	} {
		fmt.Fprintln(w, "  "+ex)
	}
	fmt.Fprintln(w, "\nglobal flags (before or after the command):")
	fmt.Fprintln(w, "  --endpoint URL         the API (else $CAPACITY_ENDPOINT, else ApiUrl of --outputs or --stack)")
	fmt.Fprintln(w, "  --key KEY              the API key (else $CAPACITY_API_KEY)")
	fmt.Fprintln(w, "  --outputs FILE         stack outputs file (cdk deploy --outputs-file; default "+defaultOutputsFile+" if present and its API is on this machine)")
	fmt.Fprintln(w, "  --stack NAME           read the outputs of this CloudFormation stack (AWS credentials from the environment)")
	fmt.Fprintln(w, "  -o, --output FORMAT    table (default) or json; under json a failure prints its problem document (RFC 9457) on stdout")
	fmt.Fprintln(w, "  --timeout D            per-request timeout (default 30s)")
	fmt.Fprintln(w, "\nexit codes: 0 ok, 1 failed or refused, 2 usage, 3 reclaim plan changed, 4 reclaim: some VM failed to terminate,")
	fmt.Fprintln(w, "            5 reclaim --wait or reclaims wait ran out (the operation goes on; the command that follows it again is printed)")
}

// groupUsage lists a group's verbs with their examples.
func (a *app) groupUsage(w io.Writer, group string) {
	for _, g := range groups {
		if g.name == group {
			fmt.Fprintf(w, "capacityctl %s: %s\n", group, g.help)
		}
	}
	fmt.Fprintf(w, "\nusage: capacityctl [global flags] %s <verb> [flags]    (capacityctl %s <verb> --help for its flags)\n\nverbs:\n", group, group)
	cmds := groupCommands(group)
	tw := newTable(w)
	for _, c := range cmds {
		fmt.Fprintf(tw, "  %s\t%s\n", c.verb, c.help)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nexamples:")
	for _, c := range cmds {
		for _, ex := range c.examples {
			fmt.Fprintln(w, "  "+ex)
		}
	}
}

// commandUsage is one command's help: its synopsis, what it does, examples and every flag.
func (a *app) commandUsage(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: capacityctl %s %s\n  %s\n", c.name(), c.args, c.help)
	if len(c.examples) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, ex := range c.examples {
			fmt.Fprintln(w, "  "+ex)
		}
	}
	fmt.Fprintln(w, "\nflags (global flags included):")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func (a *app) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.endpoint, "endpoint", a.endpoint, "API base URL")
	fs.StringVar(&a.key, "key", a.key, "API key")
	fs.StringVar(&a.output, "output", orDefault(a.output, "table"), "table or json")
	fs.StringVar(&a.output, "o", orDefault(a.output, "table"), "table or json (--output)")
	fs.StringVar(&a.outputsFile, "outputs", a.outputsFile, "stack outputs file")
	fs.StringVar(&a.stack, "stack", a.stack, "CloudFormation stack name")
	fs.DurationVar(&a.timeout, "timeout", orDefaultDuration(a.timeout, 30*time.Second), "per-request timeout")
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func orDefaultDuration(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

// parse parses a command's flags and refuses leftovers beyond maxArgs positional arguments.
// --help prints the command's help on stdout.
func (a *app) parse(fs *flag.FlagSet, args []string, maxArgs int) ([]string, error) {
	// Positional arguments may come before the flags (keys revoke KEY_ID --reason x).
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	usage := fs.Usage
	fs.Usage = func() {} // the flag package would print it on -h and on errors: done below
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		if a.cmd != nil {
			a.commandUsage(a.io.out, *a.cmd, fs)
		}
		return nil, &exitError{code: exitOK}
	}
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err, usage: usage}
	}
	pos = append(pos, fs.Args()...)
	look := func(name string) string {
		if f := fs.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	a.target = target{node: look("node"), reservation: look("reservation"), units: look("units"), reclaim: look("reclaim")}
	if a.cmd != nil && a.cmd.group == "scheduled" {
		a.target.scheduled = look("id")
	}
	if len(pos) > maxArgs {
		return nil, usageErr(fs, "unexpected argument %q", pos[maxArgs])
	}
	if a.output != "table" && a.output != "json" {
		output := a.output
		a.output = "table" // the problem is told as text: json was not asked for
		return nil, usageErr(fs, "--output must be table or json, not %q", output)
	}
	return pos, nil
}

func required(fs *flag.FlagSet, pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if strings.TrimSpace(pairs[i+1]) == "" {
			return usageErr(fs, "--%s is required", pairs[i])
		}
	}
	return nil
}

// list splits a comma-separated flag value, dropping blanks.
func list(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ---- where the API is ----

// stackOutputs resolves the stack outputs: --stack, else --outputs, else the local stack's
// outputs file if present. It returns nil when none is named or found.
func (a *app) stackOutputs(ctx context.Context) (map[string]string, error) {
	if a.outputs != nil {
		return a.outputs, nil
	}
	switch {
	case a.stack != "" && a.outputsFile == "":
		cfg, err := a.aws(ctx)
		if err != nil {
			return nil, err
		}
		describe := a.describeStack
		if describe == nil {
			describe = describeStack
		}
		out, err := describe(ctx, cfg, a.stack)
		if err != nil {
			return nil, err
		}
		a.outputs = out
	default:
		path := a.outputsFile
		if path == "" {
			if _, err := os.Stat(defaultOutputsFile); err != nil {
				return nil, nil
			}
			path = defaultOutputsFile
		}
		out, err := readOutputsFile(path, a.stack)
		if err != nil {
			return nil, err
		}
		if a.outputsFile == "" {
			// A file nobody named (one in whatever directory capacityctl runs in) may send
			// the key only to this machine: the local stack writes it so.
			if err := localOutputs(path, out[stackoutput.ApiUrl]); err != nil {
				return nil, err
			}
		}
		a.outputs = out
	}
	return a.outputs, nil
}

// localOutputs refuses the outputs of a file found by default unless its API is on a
// loopback address.
func localOutputs(path, api string) error {
	u, err := url.Parse(api)
	if err == nil && u.Host != "" && client.Loopback(u.Hostname()) {
		return nil
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s names the API %q, which is not on this machine: "+
		"an outputs file found in the current directory is used only for a local stack; name it with --outputs %s to use it", path, api, path)}
}

// readOutputsFile reads `cdk deploy --outputs-file` JSON: {"<stack>": {"<key>": "<value>"}}.
// With more than one stack in the file, stack names the one to use.
func readOutputsFile(path, stack string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read outputs file: %w", err)
	}
	var stacks map[string]map[string]string
	if err := json.Unmarshal(raw, &stacks); err != nil {
		return nil, fmt.Errorf("parse outputs file %s: %w", path, err)
	}
	if stack != "" {
		out, ok := stacks[stack]
		if !ok {
			return nil, fmt.Errorf("outputs file %s has no stack %q", path, stack)
		}
		return out, nil
	}
	if len(stacks) != 1 {
		names := make([]string, 0, len(stacks))
		for n := range stacks {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("outputs file %s holds %d stacks %v: name one with --stack", path, len(stacks), names)
	}
	for _, out := range stacks {
		return out, nil
	}
	return nil, nil
}

// describeStack reads the outputs of a deployed stack.
func describeStack(ctx context.Context, cfg aws.Config, name string) (map[string]string, error) {
	out, err := cloudformation.NewFromConfig(cfg).DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: aws.String(name)})
	if err != nil {
		return nil, fmt.Errorf("describe stack %s: %w", name, err)
	}
	if len(out.Stacks) != 1 {
		return nil, fmt.Errorf("describe stack %s: %d stacks answered", name, len(out.Stacks))
	}
	m := map[string]string{}
	for _, o := range out.Stacks[0].Outputs {
		m[aws.ToString(o.OutputKey)] = aws.ToString(o.OutputValue)
	}
	return m, nil
}

// apiEndpoint resolves the API's URL.
func (a *app) apiEndpoint(ctx context.Context) (string, error) {
	if a.endpoint != "" {
		return a.endpoint, nil
	}
	if v := a.getenv("CAPACITY_ENDPOINT"); v != "" {
		return v, nil
	}
	out, err := a.stackOutputs(ctx)
	if err != nil {
		return "", err
	}
	if out[stackoutput.ApiUrl] == "" {
		return "", &exitError{code: exitUsage, err: errors.New("no API endpoint: pass --endpoint, set CAPACITY_ENDPOINT, or name the stack with --outputs FILE or --stack NAME")}
	}
	return out[stackoutput.ApiUrl], nil
}

// client returns the API client.
func (a *app) client(ctx context.Context) (*client.Client, error) {
	ep, err := a.apiEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	if err := client.CheckEndpoint(ep); err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	key := a.key
	if key == "" {
		key = a.getenv("CAPACITY_API_KEY")
	}
	if key == "" {
		return nil, &exitError{code: exitUsage, err: errors.New("no API key: pass --key or set CAPACITY_API_KEY")}
	}
	hc := &http.Client{Timeout: a.timeout}
	if a.httpClient != nil { // tests: their transport, with the --timeout still applied
		c := *a.httpClient
		c.Timeout = a.timeout
		hc = &c
	}
	// Nor may a redirect carry the key to where it would travel in clear.
	hc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return client.CheckEndpoint(req.URL.String())
	}
	return client.New(ep, key, hc), nil
}

// aws returns the AWS configuration: the environment's (credentials, region, AWS_ENDPOINT_URL),
// or, for a local stack (an API on a loopback address, with no AWS_ENDPOINT_URL set), the
// emulator's endpoint with its test credentials, as the local stack's own clients use.
func (a *app) aws(ctx context.Context) (aws.Config, error) {
	if a.awsConfig != nil {
		return a.awsConfig(ctx)
	}
	if a.getenv("AWS_ENDPOINT_URL") == "" && a.stack == "" {
		if ep := a.localEndpoint(ctx); ep != "" {
			return aws.Config{
				Region:       orDefault(a.getenv("AWS_REGION"), "us-east-1"),
				Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
				BaseEndpoint: aws.String(ep),
			}, nil
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS configuration: %w", err)
	}
	return cfg, nil
}

// localEndpoint returns scheme://host:port of the API when it is on a loopback address (the
// local stack serves every AWS API there), else "".
func (a *app) localEndpoint(ctx context.Context) string {
	api := a.endpoint
	if api == "" {
		api = a.getenv("CAPACITY_ENDPOINT")
	}
	if api == "" {
		out, err := a.stackOutputs(ctx)
		if err != nil || out == nil {
			return ""
		}
		api = out[stackoutput.ApiUrl]
	}
	u, err := url.Parse(api)
	if err != nil || u.Host == "" {
		return ""
	}
	if client.Loopback(u.Hostname()) {
		return u.Scheme + "://" + u.Host
	}
	return ""
}
