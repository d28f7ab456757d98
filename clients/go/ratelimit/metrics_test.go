package ratelimit

import (
	"strings"
	"testing"
)

// A descriptor value comes from a request (a header, a path), so it may hold
// any character. The Prometheus text format escapes only backslash, double
// quote and line feed in a label value; any other escape (Go's %q writes \t,
// \x01, \u00a0) makes a scraper refuse the whole page. Fails when a label is
// written with %q.
func TestPrometheusLabelValuesEscapeOnlyWhatTheFormatKnows(t *testing.T) {
	m := NewMetrics()
	m.Limit("rl.user_a\tb\x01c\u00a0d\"e\\f\ng\xff").TotalHits.Add(1)
	var out strings.Builder
	m.WritePrometheus(&out)
	want := "ratelimit_service_rate_limit_total_hits{domain=\"rl\",key1=\"user_a\tb\x01c\u00a0d\\\"e\\\\f\\ng\uFFFD\"} 1\n"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("want the line %q in\n%s", want, out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		for i := 0; i < len(line); i++ {
			if line[i] == '\\' && i+1 < len(line) {
				if c := line[i+1]; c != '\\' && c != '"' && c != 'n' {
					t.Fatalf("escape \\%c the text format does not know, in %q", c, line)
				}
				i++
			}
		}
	}
}

// detailed_metric, value_to_metric and limit overrides name a counter after
// request values (a user, an IP): without a bound, memory and /metrics grow
// with every value ever seen. Past MaxKeys a new key's counts go to its
// domain's overflow key, and the totals stay whole. Fails when every key
// gets counters of its own.
func TestStatsKeysAreBounded(t *testing.T) {
	m := NewMetrics()
	m.MaxKeys = 3
	for i := 0; i < 1000; i++ {
		m.Limit("rl.user_" + string(rune('a'+i%26)) + string(rune('a'+i/26))).TotalHits.Add(1)
	}
	m.Limit("rl.user_aa").TotalHits.Add(1) // kept before the bound: its own
	var out strings.Builder
	m.WritePrometheus(&out)
	if n := strings.Count(out.String(), "ratelimit_service_rate_limit_total_hits{"); n != 4 {
		t.Fatalf("%d series of total_hits, want 3 and the overflow:\n%s", n, out.String())
	}
	if total, _, _, _, _ := m.Snapshot("rl." + OverflowKey); total != 997 {
		t.Fatalf("overflow total_hits %d, want 997", total)
	}
	if total, _, _, _, _ := m.Snapshot("rl.user_aa"); total != 2 {
		t.Fatalf("rl.user_aa total_hits %d, want 2", total)
	}
	if got := m.StatsOverflow.Load(); got != 997 {
		t.Fatalf("stats_overflow %d, want 997", got)
	}
}

// The reference's default statsd mapping (default_mapper.yaml) keeps three
// levels: domain, key1, key2; deeper levels are dropped and their counts add
// up in that series (side by side, its rate_limit.cmp.a.b_x.c counts under
// {domain="cmp",key1="a",key2="b_x"}). Dashboards written for it select on
// those labels. Fails when the deeper levels stay in key2.
func TestDeepStatsKeysShareTheReferenceSeries(t *testing.T) {
	m := NewMetrics()
	m.Limit("cmp.a.b_x.c_1").TotalHits.Add(2)
	m.Limit("cmp.a.b_x.c_2").TotalHits.Add(3)
	m.Limit("cmp.a.b_y").TotalHits.Add(1)
	var out strings.Builder
	m.WritePrometheus(&out)
	for _, want := range []string{
		"ratelimit_service_rate_limit_total_hits{domain=\"cmp\",key1=\"a\",key2=\"b_x\"} 5\n",
		"ratelimit_service_rate_limit_total_hits{domain=\"cmp\",key1=\"a\",key2=\"b_y\"} 1\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("want %q in\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "ratelimit_service_rate_limit_total_hits{"); n != 2 {
		t.Fatalf("%d total_hits series, want 2:\n%s", n, out.String())
	}
}
