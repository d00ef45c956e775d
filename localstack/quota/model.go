package quota

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openrelay/capacity/shared/table"
)

// Resources is what the template sets that the quotas depend on.
type Resources struct {
	Tables        []Table
	Functions     []Function
	StateMachines []StateMachine
	Stages        []Stage
}

// Function is a Lambda function and its reserved concurrency (0: none, it shares the
// account's unreserved pool).
type Function struct {
	Name     string
	Reserved int
}

// StateMachine is a Step Functions state machine: its ARN, type and ASL definition.
type StateMachine struct {
	ARN        string
	Type       string // STANDARD or EXPRESS
	Definition string
}

// Stage is an API Gateway stage and its default method throttle (Rate 0: none set).
type Stage struct {
	APIID string // the emulator's id of the RestApi
	Name  string
	Rate  float64
	Burst float64
}

// Stats counts what the model did to requests, per quota.
type Stats struct {
	Throttled int64         // answered with the service's throttling error
	Delayed   int64         // held back (services that delay rather than refuse)
	DelayedBy time.Duration // total delay
}

// Model holds the buckets of one stack.
type Model struct {
	cfg  Config
	rows map[ID]Row
	now  func() time.Time
	log  *slog.Logger

	tables   map[string]Table
	tasks    []taskState // Lambda tasks of the Standard state machines
	machines map[string]string
	stages   map[string]Stage

	conc *concurrency

	mu      sync.Mutex
	buckets map[string]*Bucket
	stats   map[ID]Stats
}

// New builds the model of cfg's region and scale over the stack's resources. now is the
// clock (nil: time.Now).
func New(cfg Config, res Resources, logger *slog.Logger, now func() time.Time) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rows, _ := Rows(cfg.Region)
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.Default()
	}
	m := &Model{cfg: cfg, rows: rows, now: now, log: logger, tables: map[string]Table{},
		machines: map[string]string{}, stages: map[string]Stage{},
		buckets: map[string]*Bucket{}, stats: map[ID]Stats{}}
	for _, t := range res.Tables {
		m.tables[t.Name] = t
	}
	for _, sm := range res.StateMachines {
		m.machines[sm.ARN] = sm.Type
		if sm.Type == "EXPRESS" {
			continue // Express workflows have no state-transition quota
		}
		tasks, err := taskStates(sm.Definition)
		if err != nil {
			return nil, fmt.Errorf("quota: state machine %s: %w", sm.ARN, err)
		}
		m.tasks = append(m.tasks, tasks...)
	}
	for _, st := range res.Stages {
		if cfg.Stage != nil {
			st.Rate, st.Burst = cfg.Stage.Rate, cfg.Stage.Burst
		}
		m.stages[st.APIID+"/"+st.Name] = st
	}
	fns := slices.Clone(res.Functions)
	for i, f := range fns {
		for base, n := range cfg.Reserved {
			if f.Name == base || strings.HasSuffix(f.Name, "-"+base) {
				fns[i].Reserved = n
			}
		}
	}
	m.conc = newConcurrency(m.limit(rows[LambdaConcurrency].Bucket), fns, m.limit)
	return m, nil
}

// Config is the model's region and scale.
func (m *Model) Config() Config { return m.cfg }

// scaled divides a bucket's size and rate by the scale factor; a bucket keeps room for one
// request at least.
func (m *Model) scaled(size, rate float64) (float64, float64) {
	return math.Max(1, size/m.cfg.Scale), rate / m.cfg.Scale
}

// applies reports whether the model applies quota id (Config.Only).
func (m *Model) applies(id ID) bool {
	return len(m.cfg.Only) == 0 || slices.Contains(m.cfg.Only, id)
}

// limit scales a concurrency limit, keeping one at least. Concurrency is rate times duration:
// the scale divides the rate, the local stack multiplies the duration by DurationRatio, so the
// limit is divided by what is left of the scale (never by less than 1: never above AWS's).
func (m *Model) limit(n float64) int {
	return max(1, int(math.Round(n/math.Max(1, m.cfg.Scale/max(1, m.cfg.DurationRatio)))))
}

// bucket returns the bucket of quota id for key (a partition, a stage), made full at first use.
func (m *Model) bucket(id ID, key string) *Bucket {
	size, rate := m.rows[id].Bucket, m.rows[id].Refill
	if w := m.warmOf(id, key); w > 0 {
		size, rate = w, w
	}
	return m.bucketOf(id, key, size, rate)
}

// warmOf is the modelled environment's warm throughput of a warm-throughput key ("table/index")
// of the state table, 0 for DynamoDB's default.
func (m *Model) warmOf(id ID, key string) float64 {
	name, _, _ := strings.Cut(key, "/")
	if !strings.HasSuffix(name, "-"+table.State.Suffix) {
		return 0
	}
	switch id {
	case DynamoWarmWrite:
		return m.cfg.WarmWrite
	case DynamoWarmRead:
		return m.cfg.WarmRead
	}
	return 0
}

func (m *Model) bucketOf(id ID, key string, size, rate float64) *Bucket {
	return m.bucketScaled(id, key, size, rate, true)
}

// bucketScaled is bucketOf with the scale applied or not (a quota only one reclaim meets).
func (m *Model) bucketScaled(id ID, key string, size, rate float64, scale bool) *Bucket {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := string(id) + "|" + key
	b, ok := m.buckets[k]
	if !ok {
		s, r := size, rate
		if scale {
			s, r = m.scaled(size, rate)
		}
		if !m.applies(id) {
			s, r = math.Inf(1), math.Inf(1) // a quota not modelled: a bucket that never runs dry
		}
		b = NewBucket(s, r, m.now)
		m.buckets[k] = b
	}
	return b
}

func (m *Model) throttled(id ID, attrs ...any) {
	m.mu.Lock()
	s := m.stats[id]
	s.Throttled++
	m.stats[id] = s
	m.mu.Unlock()
	m.log.Debug("quota: throttled", append([]any{"quota", string(id)}, attrs...)...)
}

func (m *Model) delayed(id ID, d time.Duration) {
	if d <= 0 {
		return
	}
	m.mu.Lock()
	s := m.stats[id]
	s.Delayed++
	s.DelayedBy += d
	m.stats[id] = s
	m.mu.Unlock()
}

// Stats returns, per quota, how many requests were throttled or delayed so far.
func (m *Model) Stats() map[ID]Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.stats)
}
