package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sivchari/kumo"

	"github.com/openrelay/capacity/shared/config/envvar"
)

// Options configures Start.
type Options struct {
	TemplatePath string                   // CloudFormation JSON written by `cdk synth -c env=local`
	StackName    string                   // default: the template's file name without .template.json
	Addr         string                   // default "127.0.0.1:4566"; any free address works ("127.0.0.1:0" picks a port)
	RepoRoot     string                   // builds ./functions/<name> relative to it; default "."
	FunctionDir  func(name string) string // optional: where function <name>'s main package is (relative to RepoRoot unless absolute)
	BuildDir     string                   // where host bootstraps and their logs go (default <RepoRoot>/build/local, build/local-<port> on another address)
	Processes    int                      // bootstrap processes per function (concurrency), default 2
	ExtraEnv     map[string]string        // added to the environment of the functions that declare each (envvar), and of every function envvar does not know
	Logger       *slog.Logger             // progress; function stdout/stderr go to <BuildDir>/logs/<fn>.log
	ReadyTimeout time.Duration            // how long bootstraps may take to poll the runtime API; default 30s
	// CallLogDir, if set, has every function log the AWS calls it makes there
	// (envvar.CallLog, shared/calllog), emptied first: what the IAM check reads.
	CallLogDir string
	// Quotas, if set, applies AWS's default quotas of a region, divided by a scale factor,
	// to every AWS call and API request through the stack (localstack/quota, docs/scale.md).
	// Off by default: without it nothing is ever throttled.
	Quotas *quota.Config
}

// DefaultAddr is where the local stack listens unless told otherwise: where LocalStack's
// tools look. kumo's calls to itself reach the stack on any address (see routeSelfCalls).
const DefaultAddr = "127.0.0.1:4566"

// Stack is a running local stack.
type Stack struct {
	name     string
	addr     string
	endpoint string
	outputs  map[string]string
	log      *slog.Logger

	listener  net.Listener
	server    *http.Server
	serveDone chan struct{}
	proxy     *proxy
	kumo      *kumo.Server
	procs     *supervisor
	prov      *provisioner // the template and its resolved resources, for IAM
	callLog   string
	bridges   *bridges // SQS pollers and the schedule firer
	quotas    *quota.Model
	functions []Function

	closeOnce sync.Once
	closeErr  error
}

// kumoClaimed is set once a Stack has put state in kumo: its services are package-level
// singletons shared by every kumo.Server in the process, so a second stack would collide with
// the first one's tables and functions.
var kumoClaimed atomic.Bool

// Start builds the template's functions, serves kumo behind the proxy on o.Addr, provisions the
// template, and starts the function bootstraps. ctx bounds startup only; Close stops the stack.
// If Start fails it stops whatever it had started.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}

	tmpl, err := loadTemplate(o.TemplatePath)
	if err != nil {
		return nil, err
	}

	if r := os.Getenv("AWS_DEFAULT_REGION"); r != "" && r != region {
		// kumo reads it once, at init, for the ARNs it builds.
		o.Logger.Warn("AWS_DEFAULT_REGION differs from the local stack's region; ARNs may disagree", "AWS_DEFAULT_REGION", r, "region", region)
	}

	// Claim the address before the slow build, so a second `make run` fails at once.
	ln, err := listen(ctx, o.Addr, o.Logger)
	if err != nil {
		return nil, err
	}

	s := &Stack{name: o.StackName, log: o.Logger, addr: o.Addr, listener: ln, endpoint: endpointURL(ln.Addr())}

	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()

	if err := writeHolder(o.Addr, o.StackName); err != nil {
		o.Logger.Warn("cannot record who holds the address", "addr", o.Addr, "error", err)
	}

	_, port, _ := net.SplitHostPort(ln.Addr().String())

	codes := functionCodes(tmpl)
	if err := buildFunctions(ctx, &o, codes); err != nil {
		return nil, err
	}

	if !kumoClaimed.CompareAndSwap(false, true) {
		return nil, errors.New("a local stack was already started in this process; kumo keeps its state in process-wide singletons, so start one stack per process")
	}

	if err := routeSelfCalls(strings.TrimPrefix(s.endpoint, "http://")); err != nil {
		return nil, err
	}

	s.kumo = kumo.NewServer()

	if s.proxy, err = newProxy(s.kumo.URL, port, o.Logger); err != nil {
		return nil, err
	}

	s.serve()

	prov := newProvisioner(tmpl, o.StackName, s.endpoint, o.Logger)
	if err := prov.run(ctx); err != nil {
		return nil, err
	}

	s.prov = prov

	if o.Quotas != nil {
		// After provisioning, so that only the stack's own traffic meets the quotas.
		if s.quotas, err = quota.New(*o.Quotas, prov.quotaRes, o.Logger, nil); err != nil {
			return nil, err
		}
		s.proxy.quota.Store(s.quotas)
		o.Logger.Warn("AWS quotas modelled", "region", o.Quotas.Region, "scale", o.Quotas.Scale)
	}

	if o.CallLogDir != "" {
		if o.CallLogDir, err = filepath.Abs(o.CallLogDir); err != nil {
			return nil, fmt.Errorf("call log: %w", err)
		}

		if err := resetDir(o.CallLogDir); err != nil {
			return nil, fmt.Errorf("call log: %w", err)
		}

		s.callLog = o.CallLogDir
		o.ExtraEnv = maps.Clone(o.ExtraEnv)
		if o.ExtraEnv == nil {
			o.ExtraEnv = map[string]string{}
		}
		o.ExtraEnv[envvar.CallLog.Name()] = o.CallLogDir
	}

	if s.outputs, err = resolveOutputs(prov.res, tmpl, s.endpoint, prov.restAPIs); err != nil {
		return nil, err
	}

	s.proxy.setAPIIDs(prov.restAPIs)

	s.procs = newSupervisor(o.Logger)

	for _, fn := range prov.functions {
		spec := processSpec{
			function: fn.name,
			binary:   o.bootstrapPath(fn.code),
			env:      functionEnv(fn, port, o.ExtraEnv),
			logPath:  filepath.Join(o.BuildDir, "logs", fn.name+".log"),
		}
		if err := s.procs.start(spec, o.Processes); err != nil {
			return nil, err
		}

		s.functions = append(s.functions, Function{Code: fn.code, Name: fn.name, Bootstrap: spec.binary, Env: slices.Clone(spec.env)})

		o.Logger.Info("started function", "function", fn.name, "processes", o.Processes, "log", spec.logPath)
	}

	if err := s.waitReady(ctx, prov.functions, o.Processes, o.ReadyTimeout, filepath.Join(o.BuildDir, "logs")); err != nil {
		return nil, err
	}

	// What kumo does not do itself: poll the queues of event source mappings, fire schedules.
	s.bridges = startBridges(s.endpoint, prov.mappings, o.Processes, prov.schedules, s.callLog, s.quotas, o.Logger)

	o.Logger.Info("local stack ready", "stack", s.name, "endpoint", s.endpoint, "functions", len(prov.functions), "outputs", s.outputs)

	return s, nil
}

// Quotas is the stack's quota model (nil unless Options.Quotas): its Stats say what it
// throttled and delayed.
func (s *Stack) Quotas() *quota.Model { return s.quotas }

// CallLogDir is where the functions log their AWS calls ("" if they do not).
func (s *Stack) CallLogDir() string { return s.callLog }

// resetDir empties dir, creating it if needed.
func resetDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}

	return os.MkdirAll(dir, 0o755)
}

// Outputs returns the resolved template Outputs (API URLs in the proxy's path form).
func (s *Stack) Outputs() map[string]string { return maps.Clone(s.outputs) }

// Function is one Lambda function of the stack as its bootstraps run.
type Function struct {
	Code      string   // its capacity:function metadata: the main package ./functions/<Code>
	Name      string   // the Lambda function name
	Bootstrap string   // the host build the stack runs
	Env       []string // the bootstraps' environment (KEY=value): the template's variables, resolved, and what Lambda sets
}

// Functions returns the stack's functions with the environment the template gives each: what
// a bootstrap started outside the stack (a benchmark) needs to start as the stack's do.
func (s *Stack) Functions() []Function {
	out := slices.Clone(s.functions)
	for i := range out {
		out[i].Env = slices.Clone(out[i].Env)
	}
	return out
}

// KillProcess kills one running bootstrap of the named function (SIGKILL to its process group,
// pick choosing among them), as a crashed execution environment: an invocation it was serving
// fails as a timed-out one does, and the stack starts the bootstrap again after a second, as
// Lambda starts a new environment. It returns the killed PID.
func (s *Stack) KillProcess(function string, pick int) (int, error) {
	return s.procs.kill(function, pick)
}

// Processes returns how many bootstraps of the named function run now, and how many
// bootstraps of any function the stack has started again after they exited.
func (s *Stack) Processes(function string) (running, restarts int) {
	return s.procs.counts(function)
}

// StackName is the stack's name: the key of its outputs in the outputs file.
func (s *Stack) StackName() string { return s.name }

// Endpoint is the URL for AWS SDK clients (BaseEndpoint / AWS_ENDPOINT_URL).
func (s *Stack) Endpoint() string { return s.endpoint }

// Close stops the bootstraps (whole process groups), the proxy and kumo. It is safe to call
// more than once.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		// The pollers and the schedule firer first: they invoke the functions.
		if s.bridges != nil {
			s.bridges.stop()
		}

		// Bootstraps next: their long polls would otherwise keep kumo's server busy.
		if s.procs != nil {
			s.procs.stop()
		}

		var errs []error

		if s.server != nil {
			if err := s.server.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close proxy: %w", err))
			}

			<-s.serveDone
		} else if s.listener != nil {
			if err := s.listener.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close listener: %w", err))
			}
		}

		removeHolder(s.addr)

		if s.proxy != nil {
			s.proxy.close()
		}

		if s.kumo != nil {
			s.kumo.Close()
		}

		s.closeErr = errors.Join(errs...)
		s.log.Info("local stack stopped", "stack", s.name)
	})

	return s.closeErr
}

func (s *Stack) serve() {
	s.server = &http.Server{
		Handler:           s.proxy,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	s.serveDone = make(chan struct{})

	go func() {
		defer close(s.serveDone)

		if err := s.server.Serve(s.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("local stack proxy stopped", "error", err)
		}
	}()
}

// waitReady waits until n bootstraps of every function poll kumo's runtime API: before the
// first poll kumo fails invocations with "no runtime handler". A bootstrap that exits before
// that fails Start, with the end of its log.
func (s *Stack) waitReady(ctx context.Context, fns []functionSpec, n int, timeout time.Duration, logDir string) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()

	for {
		var waiting []string

		for _, fn := range fns {
			if s.proxy.polling(fn.name) < n {
				waiting = append(waiting, fn.name)
			}
		}

		if len(waiting) == 0 {
			return nil
		}

		select {
		case e := <-s.procs.exits:
			return fmt.Errorf("function %s exited during startup (%v); its log %s ends:\n%s", e.function, e.err, e.logPath, logTail(e.logPath, 20))
		case <-deadline.C:
			return fmt.Errorf("functions %s did not poll the runtime API within %s; see their logs in %s",
				strings.Join(waiting, ", "), timeout, logDir)
		case <-ctx.Done():
			return fmt.Errorf("wait for functions to start: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func (o *Options) setDefaults() error {
	if o.TemplatePath == "" {
		return errors.New("local stack: Options.TemplatePath is required")
	}

	if o.Addr == "" {
		o.Addr = DefaultAddr
	}

	if o.RepoRoot == "" {
		o.RepoRoot = "."
	}

	root, err := filepath.Abs(o.RepoRoot)
	if err != nil {
		return fmt.Errorf("local stack: repo root: %w", err)
	}

	o.RepoRoot = root

	if o.BuildDir == "" {
		o.BuildDir = filepath.Join(root, "build", buildDirName(o.Addr))
	}

	if o.BuildDir, err = filepath.Abs(o.BuildDir); err != nil {
		return fmt.Errorf("local stack: build dir: %w", err)
	}

	if o.Processes <= 0 {
		o.Processes = 2
	}

	if o.Logger == nil {
		o.Logger = slog.Default()
	}

	if o.StackName == "" {
		o.StackName = stackNameFromPath(o.TemplatePath)
	}

	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}

	return nil
}

// buildDirName is the default build folder of a stack on addr: two stacks of one checkout on
// different ports keep their bootstraps and function logs apart (a bootstrap's log is
// truncated when its stack starts).
func buildDirName(addr string) string {
	if addr == DefaultAddr {
		return "local"
	}

	if _, port, err := net.SplitHostPort(addr); err == nil && port != "" {
		return "local-" + port
	}

	return "local"
}

// functionCodes lists the distinct capacity:function names of the template's Lambda functions.
func functionCodes(t *template) []string {
	seen := map[string]bool{}

	for _, r := range t.Resources {
		if r.Type == "AWS::Lambda::Function" && r.functionName() != "" {
			seen[r.functionName()] = true
		}
	}

	return slices.Sorted(maps.Keys(seen))
}

// functionEnv is the environment of a bootstrap: what Lambda sets, the function's own
// variables, and those of extra it declares (a function refuses a variable of ours it does not
// declare; one envvar does not know gets all of extra). It does not inherit the runner's environment, as on Lambda, so that a
// developer's AWS_PROFILE or credentials never reach the product code.
func functionEnv(fn functionSpec, port string, extra map[string]string) []string {
	env := map[string]string{}
	maps.Copy(env, fn.env)

	// Lambda reserves these names, so they override the function's variables.
	maps.Copy(env, map[string]string{
		"AWS_LAMBDA_RUNTIME_API":          "127.0.0.1:" + port + "/_runtime/" + fn.name,
		"AWS_ENDPOINT_URL":                "http://localhost:" + port,
		"AWS_REGION":                      region,
		"AWS_DEFAULT_REGION":              region,
		"AWS_ACCESS_KEY_ID":               "test",
		"AWS_SECRET_ACCESS_KEY":           "test",
		"AWS_LAMBDA_FUNCTION_NAME":        fn.name,
		"AWS_LAMBDA_FUNCTION_VERSION":     "$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": strconv.Itoa(int(fn.memory)),
		"AWS_LAMBDA_LOG_GROUP_NAME":       "/aws/lambda/" + fn.name,
		"AWS_LAMBDA_INITIALIZATION_TYPE":  "on-demand",
		"_HANDLER":                        fn.handler,
		"TZ":                              ":UTC",
		"PATH":                            os.Getenv("PATH"),
	})

	decl, known := envvar.Named(fn.code)
	for k, v := range extra {
		if !known || !envvar.Ours(k) || decl.Declares(k) {
			env[k] = v
		}
	}

	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}

	return out
}

// endpointURL is the proxy's URL; a wildcard listen address is reached on loopback.
func endpointURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}

	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}

	return "http://" + net.JoinHostPort(host, port)
}

// logTail returns the last n lines of a log file, for error messages.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}

	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}

	return strings.Join(lines, "\n")
}
