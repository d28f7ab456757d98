package nethttp

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// A rejection answered by the Limiter's block cache is the same 429, with
// the same policies and a Retry-After counted down, and sends nothing (INFO
// commandstats); with two limits, the second one's cached rejection
// refunds the first's admission. Catches a cached Decision the middleware
// takes for an error or an admission, and headers missing from it.
func TestCachedRejection(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	srv, h := newServer(t, l, Options{Limits: []Limit{{Window: time.Minute, Limit: 1}}})
	if resp, _ := get(t, srv.URL); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	server, _ := get(t, srv.URL)
	calls := redisServer.Calls("xcloak.allow")
	cached, body := get(t, srv.URL)
	if got := redisServer.Calls("xcloak.allow"); got != calls || l.Stats().CacheHits != 1 {
		t.Fatalf("the cached rejection sent %d XCLOAK.ALLOW (%+v)", got-calls, l.Stats())
	}
	if server.StatusCode != http.StatusTooManyRequests || cached.StatusCode != http.StatusTooManyRequests || body != "Too Many Requests: try again after the Retry-After seconds\n" {
		t.Fatalf("statuses %d then %d (%q), want 429 twice", server.StatusCode, cached.StatusCode, body)
	}
	if h.count() != 1 {
		t.Errorf("the handler served %d requests, want 1", h.count())
	}
	for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
		if a, b := server.Header.Get(name), cached.Header.Get(name); a != b || a == "" {
			t.Errorf("%s: the server's %q, the cache's %q", name, a, b)
		}
	}
	sRetry, _ := strconv.Atoi(server.Header.Get("Retry-After"))
	cRetry, err := strconv.Atoi(cached.Header.Get("Retry-After"))
	if err != nil || cRetry < 1 || cRetry > sRetry {
		t.Errorf("Retry-After %q after the server's %d", cached.Header.Get("Retry-After"), sRetry)
	}

	// Two limits: the address blocked in the cache, the account admitted
	// then refunded (one ALLOW, one REFUND).
	two, _ := newServer(t, l, Options{Limits: []Limit{{Name: "acct", Window: time.Minute, Limit: 5}, {Window: time.Minute, Limit: 1}}})
	allows, refunds := redisServer.Calls("xcloak.allow"), redisServer.Calls("xcloak.refund")
	if resp, _ := get(t, two.URL); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("two limits: %d %v", resp.StatusCode, resp.Header)
	}
	if a, r := redisServer.Calls("xcloak.allow")-allows, redisServer.Calls("xcloak.refund")-refunds; a != 1 || r != 1 {
		t.Errorf("two limits: %d ALLOW, %d REFUND; want the account's admission and its refund", a, r)
	}
	if n := redisServer.Do("ZCARD", "rl:acct:127.0.0.1").(int64); n != 0 {
		t.Errorf("the account's window holds %d, want 0 (refunded)", n)
	}
}
