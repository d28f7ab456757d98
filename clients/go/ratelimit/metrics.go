package ratelimit

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Counters are one limit's statistics, named as envoyproxy/ratelimit names
// them (its README, "Statistics"): ratelimit.service.rate_limit.<stats
// key>.<counter>, exposed for Prometheus as its default statsd mapping
// does: ratelimit_service_rate_limit_<counter>{domain, key1, key2}.
type Counters struct {
	TotalHits   atomic.Uint64
	OverLimit   atomic.Uint64
	NearLimit   atomic.Uint64
	WithinLimit atomic.Uint64
	ShadowMode  atomic.Uint64
}

// DefaultMaxStatsKeys bounds the limits' counters (XCLOAK_MAX_STATS_KEYS).
const DefaultMaxStatsKeys = 10_000

// OverflowKey is the last level of the stats key that counts, per domain,
// the limits past MaxKeys.
const OverflowKey = "xcloak_stats_overflow"

// Metrics holds every counter of the service.
type Metrics struct {
	mu     sync.RWMutex
	limits map[string]*Counters
	// MaxKeys bounds the stats keys kept (set before the first use; 0:
	// DefaultMaxStatsKeys). A key is made of request values with
	// detailed_metric, value_to_metric or a limit override (a user, an IP,
	// a path), so without a bound the counters and /metrics grow with
	// every value ever seen. Past the bound, a new key's counts go to its
	// domain's "<domain>.xcloak_stats_overflow", and StatsOverflow counts
	// the lookups sent there.
	MaxKeys int

	ConfigLoadSuccess atomic.Uint64
	ConfigLoadError   atomic.Uint64
	RedisError        atomic.Uint64
	ServiceError      atomic.Uint64
	GlobalShadowMode  atomic.Uint64
	// Calls counts ShouldRateLimit calls; Unlimited the descriptors answered
	// without Redis.
	Calls     atomic.Uint64
	Unlimited atomic.Uint64
	// StatsOverflow counts the lookups of a new stats key past MaxKeys.
	StatsOverflow atomic.Uint64
}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics { return &Metrics{limits: map[string]*Counters{}} }

// Limit returns the counters of a stats key, created on first use.
func (m *Metrics) Limit(statsKey string) *Counters {
	m.mu.RLock()
	c := m.limits[statsKey]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.limits[statsKey]; c != nil {
		return c
	}
	maxKeys := m.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxStatsKeys
	}
	if len(m.limits) >= maxKeys {
		m.StatsOverflow.Add(1)
		domain, _, _ := strings.Cut(statsKey, ".")
		statsKey = domain + "." + OverflowKey
		if c = m.limits[statsKey]; c != nil {
			return c
		}
		// One overflow key per configured domain, past the bound.
	}
	c = &Counters{}
	m.limits[statsKey] = c
	return c
}

// Snapshot returns the counters of a stats key (zeros when never used).
func (m *Metrics) Snapshot(statsKey string) (total, over, near, within, shadow uint64) {
	m.mu.RLock()
	c := m.limits[statsKey]
	m.mu.RUnlock()
	if c == nil {
		return
	}
	return c.TotalHits.Load(), c.OverLimit.Load(), c.NearLimit.Load(), c.WithinLimit.Load(), c.ShadowMode.Load()
}

// record counts one descriptor's decision as the reference does: hits units
// asked, used units in the window before this request, the limit, whether it
// was over (rejected, or over in shadow mode) and the near-limit ratio.
func (c *Counters) record(hits, before, limit uint64, over, shadow bool, nearRatio float64) {
	c.TotalHits.Add(hits)
	after := before + hits
	near := uint64(float64(float32(limit) * float32(nearRatio)))
	if over {
		if before >= limit {
			c.OverLimit.Add(hits)
		} else {
			c.OverLimit.Add(after - limit)
			c.NearLimit.Add(limit - max(near, before))
		}
		if shadow {
			if before >= limit {
				c.ShadowMode.Add(hits)
			} else {
				c.ShadowMode.Add(after - limit)
			}
		}
		return
	}
	if after > near {
		if before >= near {
			c.NearLimit.Add(hits)
		} else {
			c.NearLimit.Add(after - near)
		}
	}
	c.WithinLimit.Add(hits)
}

// WritePrometheus writes every counter in the Prometheus text format.
func (m *Metrics) WritePrometheus(w io.Writer) {
	// Stats keys deeper than domain.key1.key2 share the series of their
	// first three levels, as in the reference's mapping: their counts add up.
	series := map[string][]*Counters{}
	m.mu.RLock()
	for k, c := range m.limits {
		l := labels(k)
		series[l] = append(series[l], c)
	}
	m.mu.RUnlock()
	keys := make([]string, 0, len(series))
	for l := range series {
		keys = append(keys, l)
	}
	sort.Strings(keys)
	type counter struct {
		name string
		get  func(*Counters) uint64
	}
	counters := []counter{
		{"total_hits", func(c *Counters) uint64 { return c.TotalHits.Load() }},
		{"over_limit", func(c *Counters) uint64 { return c.OverLimit.Load() }},
		{"near_limit", func(c *Counters) uint64 { return c.NearLimit.Load() }},
		{"within_limit", func(c *Counters) uint64 { return c.WithinLimit.Load() }},
		{"shadow_mode", func(c *Counters) uint64 { return c.ShadowMode.Load() }},
	}
	for _, ct := range counters {
		name := "ratelimit_service_rate_limit_" + ct.name
		fmt.Fprintf(w, "# TYPE %s counter\n", name)
		for _, l := range keys {
			sum := uint64(0)
			for _, c := range series[l] {
				sum += ct.get(c)
			}
			fmt.Fprintf(w, "%s{%s} %d\n", name, l, sum)
		}
	}
	service := []struct {
		name string
		v    *atomic.Uint64
	}{
		{"ratelimit_service_config_load_success", &m.ConfigLoadSuccess},
		{"ratelimit_service_config_load_error", &m.ConfigLoadError},
		{"ratelimit_service_should_rate_limit_redis_error", &m.RedisError},
		{"ratelimit_service_should_rate_limit_service_error", &m.ServiceError},
		{"ratelimit_service_global_shadow_mode", &m.GlobalShadowMode},
		{"ratelimit_service_calls", &m.Calls},
		{"ratelimit_service_unlimited", &m.Unlimited},
		{"ratelimit_service_stats_overflow", &m.StatsOverflow},
	}
	for _, s := range service {
		fmt.Fprintf(w, "# TYPE %s counter\n%s %d\n", s.name, s.name, s.v.Load())
	}
}

// labels splits a stats key "domain.key1.key2[.more]" into the labels of the
// reference's default statsd mapping (src/stats/prom/default_mapper.yaml:
// its regex drops the levels past key2).
func labels(statsKey string) string {
	parts := strings.SplitN(statsKey, ".", 4)
	out := "domain=" + labelValue(parts[0])
	if len(parts) > 1 {
		out += ",key1=" + labelValue(parts[1])
	}
	if len(parts) > 2 {
		out += ",key2=" + labelValue(parts[2])
	}
	return out
}

// labelEscaper escapes a label value as the Prometheus text format does:
// only backslash, double quote and line feed. Go's %q is not that format
// (it writes \t, \x01, \u00a0...), and a scraper refuses the whole page at
// the first escape it does not know, so one descriptor value from a request
// header would have hidden every counter.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// labelValue quotes v as a Prometheus label value (valid UTF-8).
func labelValue(v string) string {
	return `"` + labelEscaper.Replace(strings.ToValidUTF8(v, "\uFFFD")) + `"`
}
