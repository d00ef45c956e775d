package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
)

// versionInfo is what version prints: the build, and the API capacityctl would call (it
// makes no request).
type versionInfo struct {
	Module    string `json:"module"`
	Version   string `json:"version"` // the module's version: (devel) when built from a checkout
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified,omitempty"` // built from a checkout with uncommitted changes
	GoVersion string `json:"goVersion"`
	API       string `json:"api,omitempty"`
	// APIError says why no API is named (no endpoint given or found).
	APIError string `json:"apiError,omitempty"`
}

// readBuildInfo is runtime/debug.ReadBuildInfo; tests replace it.
var readBuildInfo = debug.ReadBuildInfo

func versionCmd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	var v versionInfo
	if bi, ok := readBuildInfo(); ok {
		v.Module, v.Version, v.GoVersion = bi.Main.Path, bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if ep, err := a.apiEndpoint(ctx); err != nil {
		v.APIError = err.Error()
	} else {
		v.API = ep
	}
	if a.output == "json" {
		return printValue(a.io.out, v)
	}
	tw := newTable(a.io.out)
	fmt.Fprintf(tw, "capacityctl\t%s %s\n", orDefault(v.Module, "(no build information)"), v.Version)
	if v.Revision != "" {
		modified := ""
		if v.Modified {
			modified = " (with uncommitted changes)"
		}
		fmt.Fprintf(tw, "revision\t%s%s\n", v.Revision, modified)
		fmt.Fprintf(tw, "built from a commit of\t%s\n", dash(v.Time))
	}
	fmt.Fprintf(tw, "go\t%s\n", dash(v.GoVersion))
	if v.API != "" {
		fmt.Fprintf(tw, "api\t%s\n", v.API)
	} else {
		fmt.Fprintf(tw, "api\tnone (%s)\n", v.APIError)
	}
	return tw.Flush()
}
