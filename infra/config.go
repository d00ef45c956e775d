package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"

	"github.com/openrelay/capacity/shared/capacity"
)

// EnvironmentsContextKey is the cdk.json context key holding every environment's settings,
// {"<env>": EnvConfig, ...}. It is the one place an environment is configured.
const EnvironmentsContextKey = "environments"

// LocalEnv is the environment of the local stack: environment-agnostic (no account, region
// or alarm subscription), so that it synthesises without credentials or lookups.
const LocalEnv = "local"

// EnvConfig is one environment's block of cdk.json "environments". Pointers are required
// values, so that an absent one is told apart from a zero.
type EnvConfig struct {
	// Account (12 digits) and Region become the stack's env: deploying with credentials of
	// another account or region fails instead of creating a second copy. Required except in local.
	Account string `json:"account,omitempty"`
	Region  string `json:"region,omitempty"`
	// Throttle limits the API stage (requests per second, burst). Required.
	Throttle *struct {
		Rate  *float64 `json:"rate"`
		Burst *float64 `json:"burst"`
	} `json:"throttle"`
	// AlarmSubscription is who the environment's alarm topic notifies: an email address or an
	// https endpoint. Required except in local.
	AlarmSubscription string `json:"alarmSubscription,omitempty"`
	// EventPrincipals are the EventBridge sources whose inbound events the environment
	// accepts, each with whom it acts as and the IAM roles that alone may send it. Required
	// (an empty list accepts no inbound event: fail closed).
	EventPrincipals *[]EventPrincipalConfig `json:"eventPrincipals"`
	// Retention: history of the store (terminated VMs, finished operations) and logs, in days.
	// Required.
	Retention *struct {
		HistoryDays *float64 `json:"historyDays"`
		LogDays     *float64 `json:"logDays"`
	} `json:"retention"`
	// LogLevel of every function: debug, info, warn or error. Required.
	LogLevel string `json:"logLevel"`
	// Optional: the termination workflow (defaults DefaultTerminate*) and an existing agent
	// master secret's name (default: the stack creates one).
	Termination *struct {
		Rounds           float64 `json:"rounds,omitempty"`
		RetryWaitSeconds float64 `json:"retryWaitSeconds,omitempty"`
	} `json:"termination,omitempty"`
	AgentMasterSecret string `json:"agentMasterSecret,omitempty"`
	// The role that may open agent keys and read the agent master secret besides
	// terminate-node, in the environment's account; it must exist before the deploy.
	// Required outside local.
	AgentKeysBreakGlassRole string `json:"agentKeysBreakGlassRole,omitempty"`
	// Optional alarm thresholds (defaults DefaultAlarm*): the API's 5xx rate (a fraction of
	// requests) and p99 latency (ms).
	Alarms *struct {
		ApiErrorRate *float64 `json:"apiErrorRate,omitempty"`
		ApiP99Millis *float64 `json:"apiP99Millis,omitempty"`
	} `json:"alarms,omitempty"`
	// Optional: the most pending scheduled reclaims one org may have (default
	// capacity.DefaultMaxPendingScheduled), a whole number from 1 to MaxPendingScheduledLimit.
	MaxPendingScheduledPerOrg *float64 `json:"maxPendingScheduledPerOrg,omitempty"`
	// Optional scale settings (docs/scale.md, "Index and reconciler"): the state table's
	// and its indexes' warm throughput (units a second it takes at once; unset: a new
	// on-demand table's 4,000 writes and 12,000 reads); the api function's reserved
	// concurrency (so that a terminate-node brown-out cannot take the account's pool) and
	// terminate-node's cap (unset: the shared pool, as before); the reconciler's starts a
	// second (default capacity.DefaultStartRate).
	Scale *struct {
		WarmWriteUnits      *float64 `json:"warmWriteUnits,omitempty"`
		WarmReadUnits       *float64 `json:"warmReadUnits,omitempty"`
		ApiConcurrency      *float64 `json:"apiConcurrency,omitempty"`
		TerminateNodeCap    *float64 `json:"terminateNodeConcurrency,omitempty"`
		ReconcilerStartRate *float64 `json:"reconcilerStartRate,omitempty"`
	} `json:"scale,omitempty"`
	// Optional: each API key's rate limit (default DefaultRateLimit): perSecond calls a second
	// on average (above 0, at most capacity.MaxRatePerSecond) and burst calls at once (a whole
	// number from 1 to capacity.MaxRateBurst). Both are required when the block is given.
	RateLimit *struct {
		PerSecond *float64 `json:"perSecond"`
		Burst     *float64 `json:"burst"`
	} `json:"rateLimit,omitempty"`
}

// DefaultRateLimit is each API key's rate limit in an environment whose cdk.json block sets
// none: well under the stage's default throttle, so one key cannot take the whole stage.
var DefaultRateLimit = capacity.RateLimit{PerSecond: 50, Burst: 100}

// MaxPendingScheduledLimit bounds maxPendingScheduledPerOrg: each pending scheduled reclaim
// is a one-time schedule, and EventBridge Scheduler's account quota is a million of them.
const MaxPendingScheduledLimit = 10000

// EventPrincipalConfig is one source of cdk.json eventPrincipals: the principal its events act
// as (capacity.EventPrincipal: source, orgId, operator, permissions) and SenderRoles, the ARNs
// of the IAM roles of the environment's account that alone may put events of that source on
// the bus (the bus policy denies the source to every other principal).
type EventPrincipalConfig struct {
	capacity.EventPrincipal
	SenderRoles []string `json:"senderRoles"`
}

// LocalAccount is the account of the local stack (and of LocalStack): the one the local
// environment's sender roles may name.
const LocalAccount = "000000000000"

// MinHistoryRetentionDays matches the store's floor (dynamo.MinRetention): a finished
// operation stays readable for at least 90 days.
const MinHistoryRetentionDays = 90

var (
	accountID  = regexp.MustCompile(`^[0-9]{12}$`)
	regionName = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]$`)
	email      = regexp.MustCompile(`^[^@\s]+@[^@\s]+\.[^@\s]+$`)
	// An IAM role ARN: its account is checked against the environment's.
	roleARN   = regexp.MustCompile(`^arn:aws[a-z-]*:iam::([0-9]{12}):role/[A-Za-z0-9+=,.@_/-]{1,512}$`)
	logLevels = []string{"debug", "info", "warn", "error"}
)

// logRetentions are the retention periods CloudWatch Logs accepts, in days.
var logRetentions = map[float64]awslogs.RetentionDays{
	1: awslogs.RetentionDays_ONE_DAY, 3: awslogs.RetentionDays_THREE_DAYS, 5: awslogs.RetentionDays_FIVE_DAYS,
	7: awslogs.RetentionDays_ONE_WEEK, 14: awslogs.RetentionDays_TWO_WEEKS, 30: awslogs.RetentionDays_ONE_MONTH,
	60: awslogs.RetentionDays_TWO_MONTHS, 90: awslogs.RetentionDays_THREE_MONTHS, 120: awslogs.RetentionDays_FOUR_MONTHS,
	150: awslogs.RetentionDays_FIVE_MONTHS, 180: awslogs.RetentionDays_SIX_MONTHS, 365: awslogs.RetentionDays_ONE_YEAR,
	400: awslogs.RetentionDays_THIRTEEN_MONTHS, 545: awslogs.RetentionDays_EIGHTEEN_MONTHS, 731: awslogs.RetentionDays_TWO_YEARS,
	1096: awslogs.RetentionDays_THREE_YEARS, 1827: awslogs.RetentionDays_FIVE_YEARS, 2192: awslogs.RetentionDays_SIX_YEARS,
	2557: awslogs.RetentionDays_SEVEN_YEARS, 2922: awslogs.RetentionDays_EIGHT_YEARS, 3288: awslogs.RetentionDays_NINE_YEARS,
	3653: awslogs.RetentionDays_TEN_YEARS,
}

// EnvironmentNames lists the environments of the "environments" context value, sorted.
func EnvironmentNames(environments any) ([]string, error) {
	m, ok := environments.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("context %q: want an object of environments (see cdk.json), got %T", EnvironmentsContextKey, environments)
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// StackPropsFor reads env's block of the "environments" context value, validates it and
// turns it into stack props. Every problem of the block is reported at once.
func StackPropsFor(environments any, env string) (CapacityStackProps, error) {
	names, err := EnvironmentNames(environments)
	if err != nil {
		return CapacityStackProps{}, err
	}
	if !slices.Contains(names, env) {
		return CapacityStackProps{}, fmt.Errorf("unknown environment %q: cdk.json context %q has %s",
			env, EnvironmentsContextKey, strings.Join(names, ", "))
	}
	// Through JSON, strictly: a misspelt key is an error, not a silently ignored setting.
	raw, err := json.Marshal(environments.(map[string]any)[env])
	if err != nil {
		return CapacityStackProps{}, fmt.Errorf("environment %q: %w", env, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var c EnvConfig
	if err := dec.Decode(&c); err != nil {
		return CapacityStackProps{}, fmt.Errorf("environment %q in cdk.json: %w", env, err)
	}
	props, errs := c.props(env)
	if len(errs) > 0 {
		return CapacityStackProps{}, fmt.Errorf("environment %q in cdk.json: %w", env, errors.Join(errs...))
	}
	return props, nil
}

func (c EnvConfig) props(env string) (CapacityStackProps, []error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	p := CapacityStackProps{Env: env, Account: c.Account, Region: c.Region, LogLevel: c.LogLevel,
		AlarmSubscription: c.AlarmSubscription, AgentMasterSecretName: c.AgentMasterSecret,
		AgentKeysBreakGlassRole: c.AgentKeysBreakGlassRole}
	if err := ValidateEnv(env); err != nil {
		errs = append(errs, err)
	}

	if env == LocalEnv {
		// The local stack runs offline: nothing may tie it to an account or region.
		if c.Account != "" || c.Region != "" {
			bad("account and region must be absent: %s is environment-agnostic", LocalEnv)
		}
	} else {
		switch {
		case c.Account == "":
			bad("account is required")
		case !accountID.MatchString(c.Account):
			bad("account %q: want 12 digits", c.Account)
		}
		switch {
		case c.Region == "":
			bad("region is required")
		case !regionName.MatchString(c.Region):
			bad("region %q: want a region name such as eu-west-1", c.Region)
		}
		if c.AlarmSubscription == "" {
			bad("alarmSubscription is required (an email address or an https endpoint)")
		}
		if c.AgentKeysBreakGlassRole == "" {
			bad("agentKeysBreakGlassRole is required: the ARN of an existing role that may open agent keys in an emergency")
		}
	}
	if r := c.AgentKeysBreakGlassRole; r != "" {
		account := cmp.Or(c.Account, LocalAccount)
		if m := roleARN.FindStringSubmatch(r); m == nil || m[1] != account {
			bad("agentKeysBreakGlassRole %q: want the ARN of an IAM role in account %s", r, account)
		}
	}
	if c.AlarmSubscription != "" && !validSubscription(c.AlarmSubscription) {
		bad("alarmSubscription %q: want an email address or an https URL", c.AlarmSubscription)
	}

	if c.Throttle == nil || c.Throttle.Rate == nil || c.Throttle.Burst == nil {
		bad("throttle.rate and throttle.burst are required")
	} else {
		p.ThrottleRate, p.ThrottleBurst = *c.Throttle.Rate, *c.Throttle.Burst
		if p.ThrottleRate <= 0 || p.ThrottleBurst <= 0 || p.ThrottleBurst < p.ThrottleRate {
			bad("throttle rate %v, burst %v: want positive numbers with burst >= rate", p.ThrottleRate, p.ThrottleBurst)
		}
	}

	if c.EventPrincipals == nil {
		bad("eventPrincipals is required (a list of {source, orgId, operator, permissions, senderRoles}; [] accepts no event)")
	} else {
		account := c.Account
		if env == LocalEnv {
			account = LocalAccount
		}
		p.EventPrincipals, errs = c.eventPrincipals(account, errs)
	}

	if c.Retention == nil || c.Retention.HistoryDays == nil || c.Retention.LogDays == nil {
		bad("retention.historyDays and retention.logDays are required")
	} else {
		p.HistoryRetentionDays, p.LogRetentionDays = *c.Retention.HistoryDays, *c.Retention.LogDays
		if h := p.HistoryRetentionDays; h < MinHistoryRetentionDays || h != float64(int(h)) {
			bad("retention.historyDays %v: want a whole number of days, at least %d", h, MinHistoryRetentionDays)
		}
		if _, ok := logRetentions[p.LogRetentionDays]; !ok {
			bad("retention.logDays %v: want one of CloudWatch Logs' periods (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)", p.LogRetentionDays)
		}
	}

	if !slices.Contains(logLevels, c.LogLevel) {
		if c.LogLevel == "" {
			bad("logLevel is required (%s)", strings.Join(logLevels, ", "))
		} else {
			bad("logLevel %q: want one of %s", c.LogLevel, strings.Join(logLevels, ", "))
		}
	}

	if t := c.Termination; t != nil {
		p.TerminateRounds, p.TerminateRetryWait = t.Rounds, t.RetryWaitSeconds
	}

	p.MaxPendingScheduledPerOrg = capacity.DefaultMaxPendingScheduled
	if n := c.MaxPendingScheduledPerOrg; n != nil {
		if *n < 1 || *n > MaxPendingScheduledLimit || *n != float64(int(*n)) {
			bad("maxPendingScheduledPerOrg %v: want a whole number from 1 to %d", *n, MaxPendingScheduledLimit)
		}
		p.MaxPendingScheduledPerOrg = int(*n)
	}

	if sc := c.Scale; sc != nil {
		whole := func(name string, v *float64, lo, hi float64) float64 {
			if v == nil {
				return 0
			}
			if *v < lo || *v > hi || *v != float64(int(*v)) {
				bad("scale.%s %v: want a whole number from %v to %v", name, *v, lo, hi)
			}
			return *v
		}
		// DynamoDB's warm throughput is at least the on-demand defaults it raises.
		p.WarmWriteUnits = whole("warmWriteUnits", sc.WarmWriteUnits, 4000, 400000)
		p.WarmReadUnits = whole("warmReadUnits", sc.WarmReadUnits, 12000, 1200000)
		// Lambda keeps 100 of the account's concurrency unreserved; the default pool is 1,000.
		p.ApiConcurrency = whole("apiConcurrency", sc.ApiConcurrency, 1, 100000)
		p.TerminateNodeConcurrency = whole("terminateNodeConcurrency", sc.TerminateNodeCap, 1, 100000)
		p.ReconcilerStartRate = whole("reconcilerStartRate", sc.ReconcilerStartRate, 1, 10000)
	}

	p.RateLimit = DefaultRateLimit
	if r := c.RateLimit; r != nil {
		switch {
		case r.PerSecond == nil || r.Burst == nil:
			bad("rateLimit: perSecond and burst are both required")
		case *r.Burst != float64(int(*r.Burst)):
			bad("rateLimit.burst %v: want a whole number", *r.Burst)
		default:
			p.RateLimit = capacity.RateLimit{PerSecond: *r.PerSecond, Burst: int(*r.Burst)}
			if err := p.RateLimit.Validate(); err != nil {
				bad("rateLimit: %v", err)
			}
		}
	}

	if a := c.Alarms; a != nil {
		if r := a.ApiErrorRate; r != nil {
			if *r <= 0 || *r >= 1 {
				bad("alarms.apiErrorRate %v: want a fraction of requests, above 0 and below 1 (0.05 is 5%%)", *r)
			}
			p.AlarmApiErrorRate = *r
		}
		if ms := a.ApiP99Millis; ms != nil {
			// API Gateway ends a call at 29 s, so a higher threshold could never be crossed.
			if *ms < 1 || *ms > 29000 || *ms != float64(int(*ms)) {
				bad("alarms.apiP99Millis %v: want a whole number of milliseconds from 1 to 29000", *ms)
			}
			p.AlarmApiP99Millis = *ms
		}
	}
	return p, errs
}

// eventPrincipals validates cdk.json eventPrincipals: the principals as the service checks them
// (capacity.ValidateEventPrincipals), and at least one sender role each, in the environment's
// account (another account's role would need the bus policy to allow it, which it does not).
func (c EnvConfig) eventPrincipals(account string, errs []error) ([]EventPrincipalConfig, []error) {
	list := slices.Clone(*c.EventPrincipals)
	principals := make([]capacity.EventPrincipal, len(list))
	for i, ep := range list {
		principals[i] = ep.EventPrincipal
		if len(ep.SenderRoles) == 0 {
			errs = append(errs, fmt.Errorf("eventPrincipals %d (%s): senderRoles is required: the IAM roles that may send it", i, ep.Source))
		}
		for _, arn := range ep.SenderRoles {
			m := roleARN.FindStringSubmatch(arn)
			switch {
			case m == nil:
				errs = append(errs, fmt.Errorf("eventPrincipals %d (%s): senderRoles: %q is not an IAM role ARN", i, ep.Source, arn))
			case account != "" && m[1] != account:
				errs = append(errs, fmt.Errorf("eventPrincipals %d (%s): senderRoles: %q is not in the environment's account %s", i, ep.Source, arn, account))
			}
		}
	}
	if err := capacity.ValidateEventPrincipals(principals); err != nil {
		errs = append(errs, fmt.Errorf("eventPrincipals: %w", err))
	}
	return list, errs
}

func validSubscription(s string) bool {
	if email.MatchString(s) && !strings.Contains(s, "://") {
		return true
	}
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "https" && u.Host != ""
}
