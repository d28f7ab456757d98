package ulule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// The fewest commands per request (issue 30): ulule's own net/http
// middleware on this store sends one XCLOAK.ALLOW per request and nothing
// else (counted by the server, INFO commandstats, connection setup aside).
// Logs the server's CPU per request beside the same command sent raw from a
// handler at the same pace. Catches an extra command (a PEEK before the
// ALLOW, an EXPIRE, a SCRIPT EXISTS).
func TestCommandsPerRequest(t *testing.T) {
	server := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	const n = 2000
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	run := func(name string, h http.Handler) map[string]testserver.CommandStat {
		srv := httptest.NewServer(h)
		defer srv.Close()
		get := func() {
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d", name, resp.StatusCode)
			}
		}
		get() // the connections made
		server.Do("CONFIG", "RESETSTAT")
		for i := 0; i < n; i++ {
			get()
		}
		return server.CommandStats()
	}

	raw := run("raw", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rdb.Do(r.Context(), "XCLOAK.ALLOW", "raw", 60000, 1_000_000, "DETAILS").Err(); err != nil {
			http.Error(w, err.Error(), 500)
		}
	}))["xcloak.allow"]
	t.Logf("raw XCLOAK.ALLOW ... DETAILS in a handler: %.2f usec per call (%d calls)", float64(raw.Usec)/float64(raw.Calls), raw.Calls)

	store, err := NewStore(mustLimiter(t, rdb, xcloak.Options{}), limiter.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	instance, err := NewLimiter(store, limiter.Rate{Period: time.Minute, Limit: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	stats := run("ulule", stdlib.NewMiddleware(instance).Handler(ok))
	var usec int64
	var line string
	for command, st := range stats {
		usec += st.Usec
		line += " " + command + "=" + strconv.FormatFloat(float64(st.Calls)/n, 'f', 2, 64)
		if command != "xcloak.allow" || st.Calls != n {
			t.Errorf("%s ran %d times for %d requests (want XCLOAK.ALLOW, once each)", command, st.Calls, n)
		}
	}
	if _, ok := stats["xcloak.allow"]; !ok {
		t.Errorf("no XCLOAK.ALLOW: %v", stats)
	}
	t.Logf("ulule stdlib middleware: per request%s; server %.2f usec per request", line, float64(usec)/n)
}
