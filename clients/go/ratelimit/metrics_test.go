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
