package nethttp

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// The fewest commands per request (issue 30): what the middleware sends,
// counted by the server (INFO commandstats, connection setup aside): one
// XCLOAK.ALLOW per limit, and with SkipSuccessful one XCLOAK.REFUND per
// limit of a successful request; nothing else (no PEEK, no EXISTS, no
// SCRIPT, no WAIT). Logs the server's CPU per request beside a raw
// XCLOAK.ALLOW of the same command line on the same server (the module's
// own per-call cost). Catches an extra command per request.
func TestCommandsPerRequest(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := mustLimiter(t, rdb, xcloak.Options{})
	const n = 2000

	// The module alone, at the same pace: a handler that sends the command
	// line the middleware sends (one limit), n times over HTTP.
	baseline := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Do(r.Context(), "XCLOAK.ALLOW", "raw", 60000, 1_000_000, "DETAILS", "STAMP").Err(); err != nil {
			http.Error(w, err.Error(), 500)
		}
	}))
	get(t, baseline.URL)
	server.Do("CONFIG", "RESETSTAT")
	for i := 0; i < n; i++ {
		if resp, _ := get(t, baseline.URL); resp.StatusCode != 200 {
			t.Fatalf("baseline request %d: %d", i, resp.StatusCode)
		}
	}
	baseline.Close()
	raw := server.CommandStats()["xcloak.allow"]
	t.Logf("raw XCLOAK.ALLOW ... DETAILS STAMP in a handler: %.2f usec per call (%d calls)", float64(raw.Usec)/float64(raw.Calls), raw.Calls)

	for _, c := range []struct {
		name string
		opt  Options
		want map[string]int64 // per request
	}{
		{"one limit", Options{Limits: []Limit{{Window: time.Minute, Limit: 1_000_000}}}, map[string]int64{"xcloak.allow": 1}},
		{"two limits", Options{Limits: []Limit{{Window: time.Minute, Limit: 1_000_000}, {Name: "b", Window: time.Hour, Limit: 1_000_000}}}, map[string]int64{"xcloak.allow": 2}},
		{"one limit, two tiers", Options{Limits: []Limit{{Name: "t", Window: time.Minute, Limit: 1_000_000, Tiers: []xcloak.Tier{{Window: time.Hour, Limit: 1_000_000}}}}}, map[string]int64{"xcloak.allow": 1}},
		{"skip successful", Options{SkipSuccessful: true, Limits: []Limit{{Name: "s", Window: time.Minute, Limit: 1_000_000}}}, map[string]int64{"xcloak.allow": 1, "xcloak.refund": 1}},
		{"skip failed, successes", Options{SkipFailed: true, Limits: []Limit{{Name: "f", Window: time.Minute, Limit: 1_000_000}}}, map[string]int64{"xcloak.allow": 1}},
	} {
		srv := httptest.NewServer(mustNew(t, l, c.opt).Handler(&served{}))
		get(t, srv.URL) // the connections made
		server.Do("CONFIG", "RESETSTAT")
		for i := 0; i < n; i++ {
			if resp, _ := get(t, srv.URL); resp.StatusCode != 200 {
				t.Fatalf("%s: request %d: %d", c.name, i, resp.StatusCode)
			}
		}
		srv.Close()
		stats := server.CommandStats()
		var usec int64
		var line string
		for command, st := range stats {
			usec += st.Usec
			line += " " + command + "=" + strconv.FormatFloat(float64(st.Calls)/n, 'f', 2, 64)
			if want := c.want[command] * n; st.Calls != want {
				t.Errorf("%s: %s ran %d times for %d requests, want %d", c.name, command, st.Calls, n, want)
			}
		}
		for command := range c.want {
			if _, ok := stats[command]; !ok {
				t.Errorf("%s: no %s", c.name, command)
			}
		}
		t.Logf("%s: per request%s; server %.2f usec per request", c.name, line, float64(usec)/n)
	}
}
