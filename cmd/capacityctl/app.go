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
}

// exitError carries an exit code; usage errors also print the command's usage.
type exitError struct {
	code  int
	err   error
	usage func() // nil: none
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func usageErr(fs *flag.FlagSet, format string, args ...any) error {
	e := &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
	if fs != nil {
		e.usage = fs.Usage
	}
	return e
}

func failed(code int, err error) error { return &exitError{code: code, err: err} }

// command is one `<group> <verb>`.
type command struct {
	group, verb, args, help string
	run                     func(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error
}

func commands() []command {
	return []command{
		{"keys", "create", "--org ORG [--permissions P,...] [--operator] [--expires TIME] [--description TEXT] [--bootstrap]", "create an API key (prints its secret once); --bootstrap writes the first operator key with AWS credentials", keysCreate},
		{"keys", "list", "[--limit N] [--cursor C]", "list API keys", keysList},
		{"keys", "revoke", "KEY_ID [--reason TEXT]", "revoke an API key", keysRevoke},
		{"nodes", "put", "--node N --owner ORG --units U,... --agent-endpoint URL [--reason TEXT]", "register or update a node (a new node's agent key, or a new owner's, is printed once)", nodesPut},
		{"nodes", "rotate-key", "--node N [--reason TEXT]", "give the node's agent a new key (printed once; the previous one works 10 more minutes)", nodesRotateKey},
		{"nodes", "get", "--node N", "show a node", nodesGet},
		{"reservations", "create", "--node N --units U,... --allowed-orgs O,... [--managing-orgs O,...] [--id ID] [--status active|pending] [--starts TIME] [--ends TIME] [--contract REF] [--reason TEXT]", "create a reservation", reservationsCreate},
		{"reservations", "list", "--node N [--limit N] [--cursor C]", "list a node's reservations", reservationsList},
		{"reservations", "get", "--node N --reservation R", "show a reservation", reservationsGet},
		{"reservations", "cancel", "--node N --reservation R [--reason TEXT]", "cancel a reservation and its pending scheduled reclaims (terminates nothing; lists the VMs on its units)", reservationsCancel},
		{"reservations", "reaffirm", "--node N --reservation R [--reason TEXT]", "move a needs-review reservation back to active at the node's topology", reservationsReaffirm},
		{"scheduled", "list", "--node N --reservation R [--limit N] [--cursor C]", "list a reservation's scheduled reclaims in order of at: pending, and fired or cancelled ones until their retention ends", scheduledList},
		{"topology", "set", "--node N --units U,... [--expected-gen N] [--reason TEXT]", "set a node's unit list (its reservations go to needs-review)", topologySet},
		{"audit", "list", "--node N [--reservation R] | --keys [--limit N] [--cursor C]", "list audit records", auditList},
		{"audit", "verify", "--node N | --keys", "verify an audit hash chain; names the first altered, inserted or removed record", auditVerify},
		{"reclaim", "", "--node N --reservation R --units U,... [--reason TEXT] [--grace SECONDS] [--yes] [--wait D] [--idempotency-key K]", "dry-run, confirm, reclaim with If-Match, then follow the termination (--idempotency-key resumes an interrupted reclaim)", reclaimCmd},
	}
}

func run(ctx context.Context, args []string, std stdio, getenv func(string) string) int {
	a := &app{io: std, getenv: getenv, pollEvery: time.Second}
	return a.main(ctx, args)
}

func (a *app) main(ctx context.Context, args []string) int {
	a.io.out, a.io.err = &termSafe{w: a.io.out}, &termSafe{w: a.io.err}
	global := flag.NewFlagSet("capacityctl", flag.ContinueOnError)
	global.SetOutput(a.io.err)
	a.globalFlags(global)
	global.Usage = func() { a.usage() }
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rest := global.Args()
	if len(rest) == 0 || rest[0] == "help" {
		a.usage()
		if len(rest) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, rest, ok := a.find(rest)
	if !ok {
		fmt.Fprintf(a.io.err, "capacityctl: unknown command %q\n", strings.Join(rest, " "))
		a.usage()
		return exitUsage
	}
	name := strings.TrimSpace(cmd.group + " " + cmd.verb)
	fs := flag.NewFlagSet("capacityctl "+name, flag.ContinueOnError)
	fs.SetOutput(a.io.err)
	a.globalFlags(fs) // global flags may follow the command too
	fs.Usage = func() {
		fmt.Fprintf(a.io.err, "usage: capacityctl %s %s\n  %s\n\nflags (global flags included):\n", name, cmd.args, cmd.help)
		fs.PrintDefaults()
	}
	err := cmd.run(ctx, a, fs, rest)
	return a.report(err)
}

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

func (a *app) usage() {
	w := a.io.err
	fmt.Fprintln(w, "usage: capacityctl [global flags] <group> <verb> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-22s %s\n", strings.TrimSpace(c.group+" "+c.verb), c.help)
	}
	fmt.Fprintln(w, "\nglobal flags (before or after the command):")
	fmt.Fprintln(w, "  --endpoint URL   the API (else $CAPACITY_ENDPOINT, else ApiUrl of --outputs or --stack)")
	fmt.Fprintln(w, "  --key KEY        the API key (else $CAPACITY_API_KEY)")
	fmt.Fprintln(w, "  --outputs FILE   stack outputs file (cdk deploy --outputs-file; default "+defaultOutputsFile+" if present and its API is on this machine)")
	fmt.Fprintln(w, "  --stack NAME     read the outputs of this CloudFormation stack (AWS credentials from the environment)")
	fmt.Fprintln(w, "  --output FORMAT  table (default) or json")
	fmt.Fprintln(w, "  --timeout D      per-request timeout (default 30s)")
	fmt.Fprintln(w, "\nexit codes: 0 ok, 1 failed or refused, 2 usage, 3 reclaim plan changed, 4 reclaim: some VM failed to terminate")
}

func (a *app) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.endpoint, "endpoint", a.endpoint, "API base URL")
	fs.StringVar(&a.key, "key", a.key, "API key")
	fs.StringVar(&a.output, "output", orDefault(a.output, "table"), "table or json")
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

// report prints err and returns the exit code.
func (a *app) report(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err == nil {
			return ee.code
		}
		fmt.Fprintln(a.io.err, "capacityctl:", ee.err)
		if ee.usage != nil {
			ee.usage()
		}
		return ee.code
	}
	var pe *client.Error
	if errors.As(err, &pe) {
		fmt.Fprintf(a.io.err, "capacityctl: %s\n", err) // with what it wraps: which call, how many attempts
		if pe.RequestID != "" {
			fmt.Fprintf(a.io.err, "  request id: %s\n", pe.RequestID)
		}
		return exitFailed
	}
	fmt.Fprintln(a.io.err, "capacityctl:", err)
	return exitFailed
}

// parse parses a command's flags and refuses leftovers beyond maxArgs positional arguments.
func (a *app) parse(fs *flag.FlagSet, args []string, maxArgs int) ([]string, error) {
	// Positional arguments may come before the flags (keys revoke KEY_ID --reason x).
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) { // the flag package has printed the usage
			return nil, &exitError{code: exitOK}
		}
		return nil, &exitError{code: exitUsage, err: err} // printed with the usage by the flag package
	}
	pos = append(pos, fs.Args()...)
	if len(pos) > maxArgs {
		return nil, usageErr(fs, "unexpected argument %q", pos[maxArgs])
	}
	if a.output != "table" && a.output != "json" {
		return nil, usageErr(fs, "--output must be table or json, not %q", a.output)
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
