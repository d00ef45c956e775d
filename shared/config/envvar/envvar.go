// Package envvar is the one home of the functions' configuration: the names of the
// environment variables, their parsers and defaults, and which function reads which
// (functions.go). The stack (infra) sets the variables from these names, each function reads
// them through an Env, and the local stack runner passes a developer's variables to the
// functions that declare them. It imports only the standard library, so that infra and the
// domain-free parts may import it.
//
// A function fails at start, with an error naming the variable, on a variable of ours that it
// does not declare (a typo in the stack or in a console edit), on a value its parser refuses,
// and on a declared variable it never reads (a stale declaration).
package envvar

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Setter says who sets a variable, so that the stack's test can check it sets exactly the
// variables each function declares.
type Setter int

const (
	// Stack: the stack sets it on every function that declares it, in every environment.
	Stack Setter = iota + 1
	// StackSometimes: the stack sets it on every function that declares it in some
	// environments only (AGENT_ALLOW_HTTP in local; HISTORY_RETENTION where configured).
	StackSometimes
	// Developer: never the stack; a developer or a test sets it on the local stack (make run
	// FAULTS=...), and the local stack runner passes it to the functions that declare it.
	Developer
)

// Variable is one environment variable of ours.
type Variable interface {
	Name() string
	SetBy() Setter
}

// spec is what every variable has. Its fields are unexported: a variable is made here only.
type spec struct {
	name  string
	setBy Setter
}

// Name is the variable's name in the environment.
func (s spec) Name() string { return s.name }

// SetBy says who sets the variable.
func (s spec) SetBy() Setter { return s.setBy }

// Text is a variable holding a string.
type Text struct{ spec }

// Get returns the value, which must be set.
func (v Text) Get(e *Env) string {
	s, ok := e.value(v)
	if !ok {
		e.fail(fmt.Errorf("environment variable %s must be set", v.name))
	}
	return s
}

// Optional returns the value, "" when unset.
func (v Text) Optional(e *Env) string {
	s, _ := e.value(v)
	return s
}

// Duration is a variable holding a time.ParseDuration string, with a default when unset.
type Duration struct {
	spec
	def time.Duration
}

// Default is the value when the variable is unset (0: the reader's own default).
func (v Duration) Default() time.Duration { return v.def }

// DefaultText is Default as the stack writes it: "30s", "15m", "1h" rather than "15m0s".
func (v Duration) DefaultText() string { return FormatDuration(v.def) }

// Get returns the duration, the default when unset.
func (v Duration) Get(e *Env) time.Duration {
	s, ok := e.value(v)
	if !ok {
		return v.def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		e.fail(fmt.Errorf("environment variable %s: %w", v.name, err))
		return v.def
	}
	return d
}

// FormatDuration writes d without the zero units time.Duration.String leaves at its end.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Count is a variable holding a whole number above 0; unset, it is 0 (the reader's default).
type Count struct{ spec }

// Get returns the number, 0 when unset.
func (v Count) Get(e *Env) int {
	s, ok := e.value(v)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		e.fail(fmt.Errorf("environment variable %s: %q, want a whole number above 0", v.name, s))
		return 0
	}
	return n
}

// Number is a required variable holding a number, Whole one holding a whole number (the
// reader checks their range, as it does the same settings' from cdk.json).
type (
	Number struct{ spec }
	Whole  struct{ spec }
)

// Get returns the number, which must be set, and whether it is.
func (v Number) Get(e *Env) (float64, bool) {
	s := Text(v).Get(e)
	if s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		e.fail(fmt.Errorf("environment variable %s: %q, want a number", v.name, s))
	}
	return f, err == nil
}

// Get returns the number, which must be set, and whether it is.
func (v Whole) Get(e *Env) (int, bool) {
	s := Text(v).Get(e)
	if s == "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		e.fail(fmt.Errorf("environment variable %s: %q, want a whole number", v.name, s))
	}
	return n, err == nil
}

// Seed is a variable holding a 64-bit integer, optional.
type Seed struct{ spec }

// Get returns the number and whether it is set.
func (v Seed) Get(e *Env) (int64, bool) {
	s, ok := e.value(v)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		e.fail(fmt.Errorf("environment variable %s: %w", v.name, err))
		return 0, false
	}
	return n, true
}

// Level is a variable holding a slog level (debug, info, warn, error), info when unset.
type Level struct{ spec }

// Get returns the level, info when unset. A value slog does not know fails the function
// rather than quietly logging at info.
func (v Level) Get(e *Env) slog.Level {
	var level slog.Level
	s, ok := e.value(v)
	if !ok {
		return slog.LevelInfo
	}
	if err := level.UnmarshalText([]byte(s)); err != nil {
		e.fail(fmt.Errorf("environment variable %s: %q, want debug, info, warn or error", v.name, s))
		return slog.LevelInfo
	}
	return level
}

// LocalFlag is a variable holding "true", or "" / "false", that may be true only in APP_ENV
// local. Anything else is refused, so a typo cannot quietly change what it allows, and so is
// true in any other environment: the function fails at start rather than run insecurely.
type LocalFlag struct{ spec }

// Get returns the flag (false on an error).
func (v LocalFlag) Get(e *Env) bool {
	s, _ := e.value(v)
	switch s {
	case "", "false":
		return false
	case "true":
		if env := AppEnv.Get(e); env != "local" {
			e.fail(fmt.Errorf("environment variable %s is true in env %q: allowed only in env local", v.name, env))
			return false
		}
		return true
	}
	e.fail(fmt.Errorf("environment variable %s: %q, want true or false", v.name, s))
	return false
}

// Runtime is a variable Lambda (or the local stack runner, as Lambda does) sets: the stack
// never sets it and a function does not declare it.
type Runtime struct{ name string }

// Name is the variable's name in the environment.
func (v Runtime) Name() string { return v.name }

// Get returns the value, which must be set.
func (v Runtime) Get(e *Env) string {
	s := v.Optional(e)
	if s == "" {
		e.fail(fmt.Errorf("environment variable %s must be set (Lambda sets it)", v.name))
	}
	return s
}

// Optional returns the value, "" when unset.
func (v Runtime) Optional(e *Env) string { return e.vars[v.name] }

// Ours reports whether an environment variable's name is in our namespace, so that a
// function must declare it. The runtime's names are not: Lambda's reserved and X-Ray
// variables and the SDK's settings (AWS_*, LAMBDA_*, _HANDLER, _X_AMZN_TRACE_ID and other
// _*), the Go runtime's (GO*: GODEBUG, GOMAXPROCS, ...), the process's usual ones (PATH,
// LANG, TZ, LD_LIBRARY_PATH, PWD, SHLVL, HOME, HOSTNAME) and any name with a lowercase
// letter. Every other name is ours: all of ours are upper case with digits and underscores.
// Guessing the runtime's list instead would fail every function the day Lambda adds a name.
func Ours(name string) bool {
	for _, p := range []string{"AWS_", "LAMBDA_", "_", "GO"} {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	if slices.Contains([]string{"PATH", "LANG", "TZ", "LD_LIBRARY_PATH", "PWD", "SHLVL", "HOME", "HOSTNAME"}, name) {
		return false
	}
	return name != "" && strings.ToUpper(name) == name
}

// Env reads one function's variables. Every read is recorded; errors gather until Err.
type Env struct {
	fn   Function
	vars map[string]string
	read map[string]bool
	errs []error
}

// Load reads fn's variables from the process's environment.
func Load(fn Function) *Env { return New(fn, os.Environ()) }

// New reads fn's variables from environ ("NAME=value" strings, as os.Environ). A variable of
// ours that fn does not declare is an error (see Err).
func New(fn Function, environ []string) *Env {
	e := &Env{fn: fn, vars: make(map[string]string, len(environ)), read: map[string]bool{}}
	var unknown []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		e.vars[name] = value
		if Ours(name) && !fn.Declares(name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		e.fail(fmt.Errorf("environment variable %s is not one of %s's (%s): misspelt, or meant for another function?",
			name, fn.name, strings.Join(fn.Names(), ", ")))
	}
	return e
}

// value returns a declared variable's value and whether it is set (not empty).
func (e *Env) value(v Variable) (string, bool) {
	if !e.fn.Declares(v.Name()) {
		e.fail(fmt.Errorf("%s reads environment variable %s, which envvar does not declare for it", e.fn.name, v.Name()))
		return "", false
	}
	e.read[v.Name()] = true
	s := e.vars[v.Name()]
	return s, s != ""
}

// Declares reports whether e's function declares v: a reader shared by functions reads only
// what each declares.
func (e *Env) Declares(v Variable) bool { return e.fn.Declares(v.Name()) }

func (e *Env) fail(err error) { e.errs = append(e.errs, err) }

// Fail records an error of the reader's own checks (e.g. of variables that go together), so
// that Err reports it with the others.
func (e *Env) Fail(err error) { e.fail(err) }

// Err returns every error of the reads so far, and names the declared variables not read:
// call it once every variable has been read (a function reads all of them at start).
func (e *Env) Err() error {
	errs := e.errs
	for _, name := range e.fn.Names() {
		if !e.read[name] {
			errs = append(errs, fmt.Errorf("%s declares environment variable %s but does not read it", e.fn.name, name))
		}
	}
	return errors.Join(errs...)
}
