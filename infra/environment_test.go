package main

import (
	"testing"

	"github.com/openrelay/capacity/shared/config/envvar"
)

var configuredCache = map[string]tmpl{}

// synthConfigured returns the template of env as cdk.json configures it (synthesised once).
func synthConfigured(t *testing.T, env string) tmpl {
	t.Helper()
	if tp, ok := configuredCache[env]; ok {
		return tp
	}
	p, err := StackPropsFor(cdkJSONContext(t)[EnvironmentsContextKey], env)
	if err != nil {
		t.Fatal(err)
	}
	_, tp := synthProps(t, p)
	configuredCache[env] = tp
	return tp
}

// TestFunctionEnvironments: in every environment of cdk.json, each function gets exactly the
// variables shared/config/envvar declares it reads: none it does not declare (it would refuse
// to start), none that only a developer sets, and every one the stack always sets; the ones
// set in some environments only are set in one at least. Every declared function is created.
func TestFunctionEnvironments(t *testing.T) {
	setSomewhere := map[string]map[string]bool{} // function: variables set in some environment
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synthConfigured(t, env)
			for _, r := range tp.resources("AWS::Lambda::Function") {
				code, _ := r["Metadata"].(map[string]any)["capacity:function"].(string)
				fn, ok := envvar.Named(code)
				if !ok {
					t.Errorf("function %v: envvar declares no function %q", props(r)["FunctionName"], code)
					continue
				}
				vars, _ := props(r)["Environment"].(map[string]any)["Variables"].(map[string]any)
				if setSomewhere[code] == nil {
					setSomewhere[code] = map[string]bool{}
				}
				for name := range vars {
					setSomewhere[code][name] = true
					if !fn.Declares(name) {
						t.Errorf("%s: sets %s, which the function does not declare", code, name)
					}
				}
				for _, v := range fn.Variables() {
					_, set := vars[v.Name()]
					switch {
					case v.SetBy() == envvar.Stack && !set:
						t.Errorf("%s: does not set %s", code, v.Name())
					case v.SetBy() == envvar.Developer && set:
						t.Errorf("%s: sets %s, which only a developer sets", code, v.Name())
					}
				}
			}
		})
	}
	for _, fn := range envvar.Functions {
		if setSomewhere[fn.Name()] == nil {
			t.Errorf("no environment creates function %s", fn.Name())
			continue
		}
		for _, v := range fn.Variables() {
			if v.SetBy() == envvar.StackSometimes && !setSomewhere[fn.Name()][v.Name()] {
				t.Errorf("%s: no environment sets %s", fn.Name(), v.Name())
			}
		}
	}
}

// TestFunctionLogLevels: in every environment of cdk.json, Lambda writes none of its own INFO
// lines (START, END, REPORT: system level WARN) and filters each function's JSON lines at the
// environment's logLevel, but never above INFO: the EMF metric lines carry no level, and
// Lambda reads them as INFO (LOG_LEVEL filters the function's own lines anyway).
func TestFunctionLogLevels(t *testing.T) {
	for _, env := range allEnvs {
		t.Run(env, func(t *testing.T) {
			tp := synthConfigured(t, env)
			for _, r := range tp.resources("AWS::Lambda::Function") {
				p := props(r)
				level, _ := p["Environment"].(map[string]any)["Variables"].(map[string]any)["LOG_LEVEL"].(string)
				want := "INFO"
				if level == "debug" {
					want = "DEBUG"
				}
				lc, _ := p["LoggingConfig"].(map[string]any)
				if lc["LogFormat"] != "JSON" || lc["SystemLogLevel"] != "WARN" || lc["ApplicationLogLevel"] != want {
					t.Errorf("%v (LOG_LEVEL %s): LoggingConfig %s, want LogFormat JSON, SystemLogLevel WARN, ApplicationLogLevel %s",
						p["FunctionName"], level, toJSON(lc), want)
				}
			}
		})
	}
}
