package quota

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Config turns the quota model on: AWS's default quotas of Region, every bucket size, refill
// rate and concurrency limit divided by Scale (at least 1). A burst of N requests against a
// stack at Scale s meets the walls a burst of N*s meets on AWS, in the same order.
type Config struct {
	Region string
	Scale  float64
	// Only, if set, models these quotas alone (the others never throttle): one wall at a
	// time, as a test that shows where it binds wants. Empty: every quota.
	Only []ID
	// Stage, if set, is the stage throttle of the environment being modelled (cdk.json's
	// throttle of CAPACITY_QUOTA_ENV): it replaces the template's on every stage, since the
	// local template carries the local environment's throttle, not the modelled one's.
	Stage *Throttle
	// WarmWrite and WarmRead, if set, are the modelled environment's warm throughput of the
	// state table and its indexes (cdk.json's scale.warmWriteUnits, warmReadUnits), and
	// Reserved its functions' reserved concurrency by name (scale.apiConcurrency: "api",
	// scale.terminateNodeConcurrency: "terminate-node"): they replace the template's, as Stage.
	WarmWrite, WarmRead float64
	Reserved            map[string]int
	// DurationRatio is how many times longer a function's invocation takes on the local stack
	// under load than on AWS (0: 1). Concurrency is rate times duration, and the scale divides
	// only the rate: concurrency limits are divided by Scale/DurationRatio (at least 1).
	DurationRatio float64
}

// Throttle is an API Gateway stage throttle: requests a second and burst.
type Throttle struct {
	Rate  float64 `json:"rate"`
	Burst float64 `json:"burst"`
}

// DefaultDurationRatio is the local/AWS duration ratio FromEnv assumes. Run B of docs/scale.md
// (scale 50) held each api invocation 1 to 15 s (mostly queued for one of the function's four
// local processes, where AWS starts another sandbox); the handler alone takes 14-18 ms
// (docs/numbers.md), about AWS's: at least 50 times longer.
const DefaultDurationRatio = 50

// Environment variables of the runner (make run, benchmarks): CAPACITY_QUOTA_SCALE turns the
// model on; the region is CAPACITY_QUOTA_REGION, or that of the cdk.json environment named by
// CAPACITY_QUOTA_ENV (default prod: the fleet being modelled).
const (
	EnvScale  = "CAPACITY_QUOTA_SCALE"
	EnvRegion = "CAPACITY_QUOTA_REGION"
	EnvEnv    = "CAPACITY_QUOTA_ENV"
	EnvOnly   = "CAPACITY_QUOTA_ONLY" // comma-separated quota IDs (Config.Only)
	// EnvDurationRatio sets Config.DurationRatio (default DefaultDurationRatio); 1 applies
	// concurrency limits divided by the whole scale, for durations as long locally as on AWS
	// (an agent's brown-out).
	EnvDurationRatio = "CAPACITY_QUOTA_DURATION_RATIO"
)

// FromEnv reads the Config from the environment; nil when CAPACITY_QUOTA_SCALE is unset or
// empty (the model is off). repoRoot holds cdk.json.
func FromEnv(repoRoot string) (*Config, error) {
	s := os.Getenv(EnvScale)
	if s == "" {
		return nil, nil
	}
	scale, err := strconv.ParseFloat(s, 64)
	if err != nil || scale < 1 {
		return nil, fmt.Errorf("%s=%q: want a number, 1 or more", EnvScale, s)
	}
	env := os.Getenv(EnvEnv)
	if env == "" {
		env = "prod"
	}
	e, err := environmentOf(filepath.Join(repoRoot, "cdk.json"), env)
	if err != nil {
		return nil, err
	}
	region := os.Getenv(EnvRegion)
	if region == "" {
		if e.Region == "" {
			return nil, errors.New("cdk.json: environment " + env + " names no region")
		}
		region = e.Region
	}
	c := &Config{Region: region, Scale: scale, Stage: e.Throttle, DurationRatio: DefaultDurationRatio}
	if sc := e.Scale; sc != nil {
		c.WarmWrite, c.WarmRead = sc.WarmWriteUnits, sc.WarmReadUnits
		c.Reserved = map[string]int{}
		for fn, n := range map[string]int{"api": sc.APIConcurrency, "terminate-node": sc.TerminateNodeConcurrency} {
			if n > 0 {
				c.Reserved[fn] = n
			}
		}
	}
	if s := os.Getenv(EnvDurationRatio); s != "" {
		if c.DurationRatio, err = strconv.ParseFloat(s, 64); err != nil || c.DurationRatio < 1 {
			return nil, fmt.Errorf("%s=%q: want a number, 1 or more", EnvDurationRatio, s)
		}
	}
	for id := range strings.SplitSeq(os.Getenv(EnvOnly), ",") {
		if id = strings.TrimSpace(id); id != "" {
			c.Only = append(c.Only, ID(id))
		}
	}
	return c, c.Validate()
}

// Validate reports a region the table has no rows for, or a scale below 1.
func (c *Config) Validate() error {
	if c.Scale < 1 {
		return fmt.Errorf("quota: scale %v: want 1 or more", c.Scale)
	}
	if c.DurationRatio != 0 && c.DurationRatio < 1 {
		return fmt.Errorf("quota: duration ratio %v: want 1 or more", c.DurationRatio)
	}
	if c.Stage != nil && (c.Stage.Rate <= 0 || c.Stage.Burst <= 0) {
		return fmt.Errorf("quota: stage throttle %+v: want a rate and a burst above 0", *c.Stage)
	}
	rows, err := Rows(c.Region)
	if err != nil {
		return err
	}
	for _, id := range c.Only {
		if _, ok := rows[id]; !ok && id != StageThrottle {
			return fmt.Errorf("quota: no quota %q", id)
		}
	}
	return nil
}

// environment is what the model reads of one cdk.json environment.
type environment struct {
	Region   string    `json:"region"`
	Throttle *Throttle `json:"throttle"`
	Scale    *struct {
		WarmWriteUnits           float64 `json:"warmWriteUnits"`
		WarmReadUnits            float64 `json:"warmReadUnits"`
		APIConcurrency           int     `json:"apiConcurrency"`
		TerminateNodeConcurrency int     `json:"terminateNodeConcurrency"`
	} `json:"scale"`
}

func environmentOf(cdkJSON, env string) (environment, error) {
	data, err := os.ReadFile(cdkJSON)
	if err != nil {
		return environment{}, err
	}
	var doc struct {
		Context struct {
			Environments map[string]environment `json:"environments"`
		} `json:"context"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return environment{}, fmt.Errorf("%s: %w", cdkJSON, err)
	}
	e, ok := doc.Context.Environments[env]
	if !ok {
		return environment{}, fmt.Errorf("%s: no environment %q", cdkJSON, env)
	}
	return e, nil
}

// RegionOf is the region of environment env in cdk.json's context.environments.
func RegionOf(cdkJSON, env string) (string, error) {
	e, err := environmentOf(cdkJSON, env)
	if err != nil {
		return "", err
	}
	if e.Region == "" {
		return "", errors.New(cdkJSON + ": environment " + env + " names no region")
	}
	return e.Region, nil
}
