package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// TestCdkNag synthesises every environment of cdk.json, as configured there, with the cdk-nag
// AwsSolutions pack applied, and fails on any finding (error or warning) that is not
// suppressed. The suppressions, each with its reason, are in nag.go, at the narrowest scope.
func TestCdkNag(t *testing.T) {
	ctx := cdkJSONContext(t)
	envs, err := EnvironmentNames(ctx[EnvironmentsContextKey])
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range envs {
		t.Run(env, func(t *testing.T) {
			props, err := StackPropsFor(ctx[EnvironmentsContextKey], env)
			if err != nil {
				t.Fatalf("cdk.json: %v", err)
			}
			props.AssetRoot = testAssetRoot
			out := t.TempDir()
			app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx, Outdir: jsii.String(out)})
			s, err := NewCapacityStack(app, props)
			if err != nil {
				t.Fatalf("NewCapacityStack(%q): %v", env, err)
			}
			awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{
				ReportFormats: &[]cdknag.NagReportFormat{cdknag.NagReportFormat_JSON},
			}), nil)
			// An unsuppressed error fails synth (validation); the report, written while the
			// rules run, lists it either way, as it does warnings.
			func() {
				defer func() { recover() }()
				app.Synth(nil)
			}()
			reports, _ := filepath.Glob(filepath.Join(out, "AwsSolutions-*"+*s.StackName()+"-NagReport.json"))
			if len(reports) != 1 {
				t.Fatalf("cdk-nag reports in %s: %v, want one", out, reports)
			}
			for _, f := range nagFindings(t, reports[0]) {
				t.Error(f)
			}
		})
	}
}

// nagFindings reads a cdk-nag JSON report: every line neither compliant, suppressed nor
// not applicable is a finding.
func nagFindings(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cdk-nag report: %v", err)
	}
	var report struct {
		Lines []struct {
			RuleID, ResourceID, Compliance, RuleLevel, RuleInfo string
		} `json:"lines"`
	}
	if err := json.Unmarshal(b, &report); err != nil {
		t.Fatalf("cdk-nag report %s: %v", path, err)
	}
	if len(report.Lines) == 0 {
		t.Fatalf("cdk-nag report %s has no lines: the pack did not run", path)
	}
	var out []string
	for _, l := range report.Lines {
		switch l.Compliance {
		case "Compliant", "Suppressed", "N/A":
		default:
			out = append(out, fmt.Sprintf("%s %s (%s) on %s: %s", l.Compliance, l.RuleID, l.RuleLevel, l.ResourceID, l.RuleInfo))
		}
	}
	return out
}
