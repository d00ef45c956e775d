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
}

// Environment variables of the runner (make run, benchmarks): CAPACITY_QUOTA_SCALE turns the
// model on; the region is CAPACITY_QUOTA_REGION, or that of the cdk.json environment named by
// CAPACITY_QUOTA_ENV (default prod: the fleet being modelled).
const (
	EnvScale  = "CAPACITY_QUOTA_SCALE"
	EnvRegion = "CAPACITY_QUOTA_REGION"
	EnvEnv    = "CAPACITY_QUOTA_ENV"
	EnvOnly   = "CAPACITY_QUOTA_ONLY" // comma-separated quota IDs (Config.Only)
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
	region := os.Getenv(EnvRegion)
	if region == "" {
		env := os.Getenv(EnvEnv)
		if env == "" {
			env = "prod"
		}
		if region, err = RegionOf(filepath.Join(repoRoot, "cdk.json"), env); err != nil {
			return nil, err
		}
	}
	c := &Config{Region: region, Scale: scale}
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

// RegionOf is the region of environment env in cdk.json's context.environments.
func RegionOf(cdkJSON, env string) (string, error) {
	data, err := os.ReadFile(cdkJSON)
	if err != nil {
		return "", err
	}
	var doc struct {
		Context struct {
			Environments map[string]struct {
				Region string `json:"region"`
			} `json:"environments"`
		} `json:"context"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", cdkJSON, err)
	}
	e, ok := doc.Context.Environments[env]
	if !ok {
		return "", fmt.Errorf("%s: no environment %q", cdkJSON, env)
	}
	if e.Region == "" {
		return "", errors.New(cdkJSON + ": environment " + env + " names no region")
	}
	return e.Region, nil
}
