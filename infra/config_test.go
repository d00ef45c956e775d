package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStackPropsFor(t *testing.T) {
	const good = `{
		"local": {"throttle": {"rate": 100, "burst": 200}, "allowedEventSources": [], "retention": {"historyDays": 400, "logDays": 7}, "logLevel": "info"},
		"prod": {"account": "123456789012", "region": "eu-west-1", "throttle": {"rate": 500, "burst": 1000},
			"alarmSubscription": "ops@example.com", "allowedEventSources": ["openrelay.scheduler"],
			"retention": {"historyDays": 400, "logDays": 90}, "logLevel": "warn", "termination": {"rounds": 3}}
	}`
	parse := func(s string) any {
		var v any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// edit replaces env's block of good with block.
	edit := func(env, block string) any {
		m := parse(good).(map[string]any)
		m[env] = parse(block)
		return m
	}
	prodWithout := func(key string) any {
		m := parse(good).(map[string]any)
		delete(m["prod"].(map[string]any), key)
		return m
	}
	for _, tc := range []struct {
		name, env string
		envs      any
		wantErr   string // "" = valid
	}{
		{"local", "local", parse(good), ""},
		{"prod", "prod", parse(good), ""},
		{"unknown environment", "qa", parse(good), `unknown environment "qa": cdk.json context "environments" has local, prod`},
		{"no environments", "local", nil, `context "environments": want an object`},
		{"missing account", "prod", prodWithout("account"), "account is required"},
		{"missing region", "prod", prodWithout("region"), "region is required"},
		{"missing alarm subscription", "prod", prodWithout("alarmSubscription"), "alarmSubscription is required"},
		{"missing throttle", "prod", prodWithout("throttle"), "throttle.rate and throttle.burst are required"},
		{"missing event sources", "prod", prodWithout("allowedEventSources"), "allowedEventSources is required"},
		{"missing retention", "prod", prodWithout("retention"), "retention.historyDays and retention.logDays are required"},
		{"missing log level", "prod", prodWithout("logLevel"), "logLevel is required"},
		{"misspelt key", "local", edit("local", `{"throttle": {"rate": 1, "burst": 1}, "allowedEventSources": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "logLvl": "x"}`), `unknown field "logLvl"`},
		{"local with account", "local", edit("local", `{"account": "123456789012", "throttle": {"rate": 1, "burst": 1}, "allowedEventSources": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), "environment-agnostic"},
		{"bad values", "local", edit("local", `{"throttle": {"rate": 0, "burst": 1}, "alarmSubscription": "http://x", "allowedEventSources": ["aws.ec2"], "retention": {"historyDays": 30, "logDays": 8}, "logLevel": "loud"}`),
			"throttle rate 0"},
		{"bad account", "prod", edit("prod", `{"account": "12", "region": "eu-west-1", "throttle": {"rate": 1, "burst": 1}, "alarmSubscription": "https://hooks.example.com/x", "allowedEventSources": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), `account "12": want 12 digits`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := StackPropsFor(tc.envs, tc.env)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("StackPropsFor: %v", err)
				}
				if p.Env != tc.env || p.ThrottleRate == 0 || p.LogLevel == "" || p.LogRetentionDays == 0 || p.HistoryRetentionDays == 0 {
					t.Errorf("props %+v not filled from the block", p)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("StackPropsFor error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	// Alarm thresholds: optional, validated, passed on.
	alarmsBlock := func(alarms string) any {
		return edit("local", `{"throttle": {"rate": 1, "burst": 1}, "allowedEventSources": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "alarms": `+alarms+`}`)
	}
	if p, err := StackPropsFor(alarmsBlock(`{"apiErrorRate": 0.01, "apiP99Millis": 1500}`), "local"); err != nil || p.AlarmApiErrorRate != 0.01 || p.AlarmApiP99Millis != 1500 {
		t.Errorf("alarms override: props %+v, error %v", p, err)
	}
	if p, err := StackPropsFor(parse(good), "prod"); err != nil || p.AlarmApiErrorRate != 0 || p.AlarmApiP99Millis != 0 {
		t.Errorf("no alarms block: props %+v (want zero: the stack's defaults), error %v", p, err)
	}
	_, err := StackPropsFor(alarmsBlock(`{"apiErrorRate": 5, "apiP99Millis": 30000}`), "local")
	for _, want := range []string{"alarms.apiErrorRate 5", "alarms.apiP99Millis 30000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	}
	if _, err := StackPropsFor(alarmsBlock(`{"apiErrorRat": 0.1}`), "local"); err == nil || !strings.Contains(err.Error(), `unknown field "apiErrorRat"`) {
		t.Errorf("misspelt alarms key: error %v", err)
	}

	// Topology event sources: optional (default openrelay.fleet), validated like
	// allowedEventSources, [] accepts none.
	topologyBlock := func(sources string) any {
		block := `{"throttle": {"rate": 1, "burst": 1}, "allowedEventSources": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"`
		if sources != "" {
			block += `, "topologyEventSources": ` + sources
		}
		return edit("local", block+`}`)
	}
	for _, tc := range []struct {
		name, sources string
		want          []string
	}{
		{"default", "", []string{"openrelay.fleet"}},
		{"listed", `["acme.fleet", "openrelay.fleet"]`, []string{"acme.fleet", "openrelay.fleet"}},
		{"none", `[]`, []string{}},
	} {
		p, err := StackPropsFor(topologyBlock(tc.sources), "local")
		if err != nil || p.TopologyEventSources == nil || strings.Join(p.TopologyEventSources, ",") != strings.Join(tc.want, ",") {
			t.Errorf("topologyEventSources %s: props %q, error %v; want %q", tc.name, p.TopologyEventSources, err, tc.want)
		}
	}
	if _, err := StackPropsFor(topologyBlock(`["aws.ec2", "bad source"]`), "local"); err == nil ||
		!strings.Contains(err.Error(), `topologyEventSources: "aws.ec2" is not a custom`) || !strings.Contains(err.Error(), `"bad source"`) {
		t.Errorf("bad topologyEventSources: error %v", err)
	}

	// Every problem of a block is reported at once.
	_, err = StackPropsFor(edit("local", `{"throttle": {"rate": 0, "burst": 1}, "alarmSubscription": "http://x", "allowedEventSources": ["aws.ec2"], "retention": {"historyDays": 30, "logDays": 8}, "logLevel": "loud"}`), "local")
	for _, want := range []string{"throttle rate 0", `alarmSubscription "http://x"`, `"aws.ec2" is not a custom`, "historyDays 30", "logDays 8", `logLevel "loud"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	}
}
