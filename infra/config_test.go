package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

func TestStackPropsFor(t *testing.T) {
	const good = `{
		"local": {"throttle": {"rate": 100, "burst": 200}, "eventPrincipals": [], "retention": {"historyDays": 400, "logDays": 7}, "logLevel": "info"},
		"prod": {"account": "123456789012", "region": "eu-west-1", "throttle": {"rate": 500, "burst": 1000},
			"alarmSubscription": "ops@example.com", "agentKeysBreakGlassRole": "arn:aws:iam::123456789012:role/break-glass",
			"eventPrincipals": [{"source": "openrelay.scheduler", "orgId": "platform", "operator": true, "permissions": ["reservation.capacity"],
				"senderRoles": ["arn:aws:iam::123456789012:role/scheduler"]}],
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
		{"missing event principals", "prod", prodWithout("eventPrincipals"), "eventPrincipals is required"},
		{"missing retention", "prod", prodWithout("retention"), "retention.historyDays and retention.logDays are required"},
		{"missing log level", "prod", prodWithout("logLevel"), "logLevel is required"},
		// The key policy and the secret's name who may open agent keys besides terminate-node.
		{"missing break-glass role", "prod", prodWithout("agentKeysBreakGlassRole"), "agentKeysBreakGlassRole is required"},
		{"break-glass role of another account", "prod", edit("prod", `{"account": "123456789012", "region": "eu-west-1", "throttle": {"rate": 1, "burst": 1}, "alarmSubscription": "ops@example.com", "agentKeysBreakGlassRole": "arn:aws:iam::999999999999:role/bg", "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), `agentKeysBreakGlassRole "arn:aws:iam::999999999999:role/bg": want the ARN of an IAM role in account 123456789012`},
		{"break-glass user", "local", edit("local", `{"throttle": {"rate": 1, "burst": 1}, "agentKeysBreakGlassRole": "arn:aws:iam::000000000000:user/bg", "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), "want the ARN of an IAM role"},
		{"misspelt key", "local", edit("local", `{"throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "logLvl": "x"}`), `unknown field "logLvl"`},
		// The workflow runs one node's rounds: a setting of how many nodes at once is refused.
		{"removed termination concurrency", "local", edit("local", `{"throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "termination": {"concurrency": 8}}`), `unknown field "concurrency"`},
		{"local with account", "local", edit("local", `{"account": "123456789012", "throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), "environment-agnostic"},
		{"bad values", "local", edit("local", `{"throttle": {"rate": 0, "burst": 1}, "alarmSubscription": "http://x", "eventPrincipals": [{"source": "aws.ec2", "orgId": "o", "permissions": ["reservation.capacity"], "senderRoles": ["arn:aws:iam::000000000000:role/r"]}], "retention": {"historyDays": 30, "logDays": 8}, "logLevel": "loud"}`),
			"throttle rate 0"},
		{"bad account", "prod", edit("prod", `{"account": "12", "region": "eu-west-1", "throttle": {"rate": 1, "burst": 1}, "alarmSubscription": "https://hooks.example.com/x", "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info"}`), `account "12": want 12 digits`},
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
		return edit("local", `{"throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "alarms": `+alarms+`}`)
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
	// The cap on an org's pending scheduled reclaims: optional (default 100), a whole number
	// from 1 to MaxPendingScheduledLimit.
	capBlock := func(n string) any {
		return edit("local", `{"throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "maxPendingScheduledPerOrg": `+n+`}`)
	}
	if p, err := StackPropsFor(capBlock("25"), "local"); err != nil || p.MaxPendingScheduledPerOrg != 25 {
		t.Errorf("maxPendingScheduledPerOrg 25: props %+v, error %v", p, err)
	}
	if p, err := StackPropsFor(parse(good), "local"); err != nil || p.MaxPendingScheduledPerOrg != capacity.DefaultMaxPendingScheduled {
		t.Errorf("no maxPendingScheduledPerOrg: %d, error %v; want the default", p.MaxPendingScheduledPerOrg, err)
	}
	for _, n := range []string{"0", "-1", "2.5", "10001", `"50"`} {
		if _, err := StackPropsFor(capBlock(n), "local"); err == nil || !strings.Contains(err.Error(), "maxPendingScheduledPerOrg") {
			t.Errorf("maxPendingScheduledPerOrg %s: error %v", n, err)
		}
	}
	// Each key's rate limit: optional (DefaultRateLimit), both members when given, checked as
	// the function checks it; a misspelt member is an error, not the default.
	rateBlock := func(rate string) any {
		return edit("local", `{"throttle": {"rate": 1, "burst": 1}, "eventPrincipals": [], "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "rateLimit": `+rate+`}`)
	}
	if p, err := StackPropsFor(rateBlock(`{"perSecond": 2.5, "burst": 10}`), "local"); err != nil || p.RateLimit != (capacity.RateLimit{PerSecond: 2.5, Burst: 10}) {
		t.Errorf("rateLimit 2.5/10: props %+v, error %v", p.RateLimit, err)
	}
	if p, err := StackPropsFor(parse(good), "local"); err != nil || p.RateLimit != DefaultRateLimit {
		t.Errorf("no rateLimit: %+v, error %v; want the default %+v", p.RateLimit, err, DefaultRateLimit)
	}
	for rate, want := range map[string]string{
		`{"perSecond": 0, "burst": 10}`:      "perSecond 0",
		`{"perSecond": -1, "burst": 10}`:     "perSecond -1",
		`{"perSecond": 10001, "burst": 10}`:  "perSecond 10001",
		`{"perSecond": 10, "burst": 0}`:      "burst 0",
		`{"perSecond": 10, "burst": 2.5}`:    "burst 2.5: want a whole number",
		`{"perSecond": 10, "burst": 100001}`: "burst 100001",
		`{"perSecond": 10}`:                  "both required",
		`{"burst": 10}`:                      "both required",
		`{"perSecond": "10", "burst": 10}`:   "perSecond",
		`{"perSec": 10, "burst": 10}`:        `unknown field "perSec"`,
	} {
		if _, err := StackPropsFor(rateBlock(rate), "local"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rateLimit %s: error %v, want it to say %q", rate, err, want)
		}
	}
	if _, err := StackPropsFor(alarmsBlock(`{"apiErrorRat": 0.1}`), "local"); err == nil || !strings.Contains(err.Error(), `unknown field "apiErrorRat"`) {
		t.Errorf("misspelt alarms key: error %v", err)
	}

	// Event principals: each validated as the service validates them, with sender roles of the
	// environment's account (local: 000000000000).
	principalsBlock := func(env, principals string) any {
		block := `{"throttle": {"rate": 1, "burst": 1}, "retention": {"historyDays": 90, "logDays": 7}, "logLevel": "info", "eventPrincipals": ` + principals
		if env == "prod" {
			block += `, "account": "123456789012", "region": "eu-west-1", "alarmSubscription": "ops@example.com", "agentKeysBreakGlassRole": "arn:aws:iam::123456789012:role/bg"`
		}
		return edit(env, block+`}`)
	}
	const fleet = `{"source": "openrelay.fleet", "orgId": "platform", "operator": true, "permissions": ["node.topology"], "senderRoles": [%s]}`
	for _, tc := range []struct {
		name, env, principals, wantErr string
	}{
		{"none", "local", `[]`, ""},
		{"local role", "local", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::000000000000:role/fleet"`) + "]", ""},
		{"prod role", "prod", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::123456789012:role/path/fleet"`) + "]", ""},
		{"no sender role", "prod", "[" + fmt.Sprintf(fleet, ``) + "]", "senderRoles is required"},
		{"not a role", "prod", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::123456789012:user/fleet"`) + "]", "not an IAM role ARN"},
		{"another account's role", "prod", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::999999999999:role/fleet"`) + "]", "not in the environment's account 123456789012"},
		{"local names a real account", "local", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::123456789012:role/fleet"`) + "]", "not in the environment's account 000000000000"},
		{"a source twice", "local", "[" + fmt.Sprintf(fleet, `"arn:aws:iam::000000000000:role/a"`) + "," + fmt.Sprintf(fleet, `"arn:aws:iam::000000000000:role/b"`) + "]", "twice"},
		{"topology without operator", "local", `[{"source": "acme.fleet", "orgId": "acme", "permissions": ["node.topology"], "senderRoles": ["arn:aws:iam::000000000000:role/a"]}]`, "set operator"},
		{"the service's own source", "local", `[{"source": "openrelay.capacity", "orgId": "acme", "permissions": ["reservation.capacity"], "senderRoles": ["arn:aws:iam::000000000000:role/a"]}]`, "own source"},
		{"misspelt member", "local", `[{"source": "acme.x", "orgId": "acme", "permissions": ["reservation.capacity"], "senderRole": []}]`, `unknown field "senderRole"`},
		{"old allow-list", "local", `[], "allowedEventSources": ["acme.x"]`, `unknown field "allowedEventSources"`},
	} {
		p, err := StackPropsFor(principalsBlock(tc.env, tc.principals), tc.env)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("eventPrincipals %s: %v", tc.name, err)
		case tc.wantErr == "" && p.EventPrincipals == nil:
			t.Errorf("eventPrincipals %s: nil in the props", tc.name)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("eventPrincipals %s: error %v, want one saying %q", tc.name, err, tc.wantErr)
		}
	}

	// Every problem of a block is reported at once.
	_, err = StackPropsFor(edit("local", `{"throttle": {"rate": 0, "burst": 1}, "alarmSubscription": "http://x", "eventPrincipals": [{"source": "aws.ec2", "orgId": "o", "permissions": ["reservation.capacity"], "senderRoles": ["arn:aws:iam::000000000000:role/r"]}], "retention": {"historyDays": 30, "logDays": 8}, "logLevel": "loud"}`), "local")
	for _, want := range []string{"throttle rate 0", `alarmSubscription "http://x"`, `"aws.ec2" is not a custom`, "historyDays 30", "logDays 8", `logLevel "loud"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	}
}
