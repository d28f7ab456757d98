package nethttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// served is a handler answering with the status of the request's
// ?status= (default 200), counting the requests it served.
type served struct {
	mu sync.Mutex
	n  int
}

func (s *served) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
	if r.URL.Query().Get("status") == "401" {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, "wrong password")
		return
	}
	io.WriteString(w, "ok")
}

func (s *served) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// get sends GET url over real HTTP with the headers given as name, value...
func get(t *testing.T, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func newServer(t *testing.T, l *xcloak.Limiter, opt Options) (*httptest.Server, *served) {
	h := &served{}
	srv := httptest.NewServer(mustNew(t, l, opt).Handler(h))
	t.Cleanup(srv.Close)
	return srv, h
}

// 3 a minute: three served with the headers, the fourth 429 with
// Retry-After, not served. Catches headers only on rejections, a 429 that
// still calls the handler, Retry-After missing or rounded down.
func TestLimitAndHeaders(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	srv, h := newServer(t, l, Options{Limits: []Limit{{Window: time.Minute, Limit: 3}}})
	for i := 0; i < 4; i++ {
		resp, body := get(t, srv.URL)
		wantStatus := http.StatusOK
		if i == 3 {
			wantStatus = http.StatusTooManyRequests
		}
		if resp.StatusCode != wantStatus {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"3-in-60s";q=3;w=60` {
			t.Errorf("request %d: RateLimit-Policy %q", i, got)
		}
		remaining := []string{"2", "1", "0", "0"}[i]
		if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"3-in-60s";r=`+remaining+";t=") {
			t.Errorf("request %d: RateLimit %q", i, got)
		}
		if retry := resp.Header.Get("Retry-After"); (i == 3) != (retry != "") || (i == 3 && retry != "60") {
			t.Errorf("request %d: Retry-After %q", i, retry)
		}
	}
	if h.count() != 3 {
		t.Errorf("the handler served %d requests", h.count())
	}
	if n := redisServer.Do("ZCARD", "rl:http:127.0.0.1").(int64); n != 3 {
		t.Errorf("the key of the client's address holds %d", n)
	}

	// Legacy style.
	srv2, _ := newServer(t, l, Options{Style: xcloak.StyleLegacy, Limits: []Limit{{Name: "legacy", Window: 1500 * time.Millisecond, Limit: 5}}})
	resp, _ := get(t, srv2.URL)
	if resp.Header.Get("RateLimit-Limit") != "5" || resp.Header.Get("RateLimit-Remaining") != "4" || resp.Header.Get("RateLimit-Reset") != "2" || resp.Header.Get("RateLimit-Policy") != "" {
		t.Errorf("legacy headers: %v", resp.Header)
	}
}

// Two limits per route, all or nothing: an account key (a header) and the
// address. When the account's limit rejects, the address's admission is
// refunded. (A cost above a limit is refused by New: TestConfigurationRefusedAtNew.)
func TestSeveralLimitsAllOrNothing(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	opt := Options{
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Limits: []Limit{
			{Name: "wide", Window: time.Minute, Limit: 100},
			{Name: "narrow", Window: time.Minute, Limit: 2, Tiers: []xcloak.Tier{{Window: time.Hour, Limit: 20}}, Names: []string{"per-minute", "per-hour"}},
		},
	}
	srv, h := newServer(t, l, opt)
	for i := 0; i < 3; i++ {
		resp, _ := get(t, srv.URL, "X-Account", "alice")
		if want := []int{200, 200, 429}[i]; resp.StatusCode != want {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if i == 2 {
			want := `"100-in-60s";q=100;w=60, "per-minute";q=2;w=60, "per-hour";q=20;w=3600`
			if got := resp.Header.Get("RateLimit-Policy"); got != want {
				t.Errorf("RateLimit-Policy %q, want %q", got, want)
			}
		}
	}
	if wide := redisServer.Do("ZCARD", "rl:wide:alice").(int64); wide != 2 || h.count() != 2 {
		t.Errorf("the wide key holds %d (the rejected request's admission not refunded?), served %d", wide, h.count())
	}

}

// SkipSuccessful: a login that counts only failed attempts (401). The
// successes are refunded after the response by their stamps; three
// failures fill the window. SkipFailed the other way round. Concurrent
// failures never get past the limit (no PEEK-then-ALLOW).
func TestSkipSuccessfulAndFailed(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	srv, _ := newServer(t, l, Options{SkipSuccessful: true, Limits: []Limit{{Name: "login", Window: time.Minute, Limit: 3}}})
	for i := 0; i < 5; i++ {
		if resp, _ := get(t, srv.URL); resp.StatusCode != 200 {
			t.Fatalf("success %d: %d", i, resp.StatusCode)
		}
	}
	if n := redisServer.Do("EXISTS", "rl:login:127.0.0.1").(int64); n != 0 {
		t.Errorf("successes were counted")
	}
	var wg sync.WaitGroup
	statuses := make([]int, 10)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := get(t, srv.URL+"?status=401")
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	failed := 0
	for _, s := range statuses {
		if s == 401 {
			failed++
		}
	}
	if failed != 3 {
		t.Errorf("%d of 10 concurrent failures were served, limit 3: %v", failed, statuses)
	}
	if resp, _ := get(t, srv.URL); resp.StatusCode != 429 {
		t.Errorf("after 3 failures a success is refused too: %d", resp.StatusCode)
	}

	srv2, _ := newServer(t, l, Options{SkipFailed: true, Limits: []Limit{{Name: "ok", Window: time.Minute, Limit: 2}}})
	for i := 0; i < 4; i++ {
		get(t, srv2.URL+"?status=401")
	}
	if n := redisServer.Do("EXISTS", "rl:ok:127.0.0.1").(int64); n != 0 {
		t.Errorf("failures were counted")
	}
	for i, want := range []int{200, 200, 429} {
		if resp, _ := get(t, srv2.URL); resp.StatusCode != want {
			t.Errorf("success %d: %d", i, resp.StatusCode)
		}
	}
}

// Redis down: PolicyRaise -> the ErrorHandler (500), PolicyAllow -> served
// without headers, PolicyDeny -> 503. (A bad limit never gets this far: New
// refuses it, TestConfigurationRefusedAtNew.)
func TestErrorPolicy(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: redisServer.Addr()})
	defer rdb.Close()
	var handled []error
	var mu sync.Mutex
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		mu.Lock()
		handled = append(handled, err)
		mu.Unlock()
		http.Error(w, "limiter error", http.StatusInternalServerError)
	}
	servers := map[xcloak.ErrorPolicy]*httptest.Server{}
	counts := map[xcloak.ErrorPolicy]*served{}
	for _, p := range []xcloak.ErrorPolicy{xcloak.PolicyRaise, xcloak.PolicyAllow, xcloak.PolicyDeny} {
		l := mustLimiter(t, rdb, xcloak.Options{OnError: p, Timeout: 300 * time.Millisecond})
		servers[p], counts[p] = newServer(t, l, Options{ErrorHandler: onError, Limits: []Limit{{Window: time.Minute, Limit: 10}}})
	}
	redisServer.Kill()
	for p, want := range map[xcloak.ErrorPolicy]int{xcloak.PolicyRaise: 500, xcloak.PolicyAllow: 200, xcloak.PolicyDeny: 503} {
		resp, body := get(t, servers[p].URL)
		if resp.StatusCode != want || resp.Header.Get("RateLimit-Policy") != "" || resp.Header.Get("RateLimit") != "" {
			t.Errorf("%s with Redis down: %d %q %v", p, resp.StatusCode, body, resp.Header)
		}
		if served := counts[p].count(); served != map[bool]int{true: 1, false: 0}[p == xcloak.PolicyAllow] {
			t.Errorf("%s: the handler served %d", p, served)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 1 || !errors.Is(handled[0], xcloak.ErrUnavailable) {
		t.Errorf("the ErrorHandler got %v, want the one outage of PolicyRaise", handled)
	}
}

// X-Forwarded-For and Forwarded are believed only from trusted proxies,
// and the client is the rightmost address that is not one of them.
func TestClientAddr(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []struct {
		trusted []netip.Prefix
		headers []string
		want    string
	}{
		{nil, []string{"X-Forwarded-For", "203.0.113.7"}, "127.0.0.1"},
		{loopback, nil, "127.0.0.1"},
		{loopback, []string{"X-Forwarded-For", "198.51.100.1, 203.0.113.7, 10.1.2.3"}, "203.0.113.7"},
		{loopback, []string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "10.0.0.9"}, "198.51.100.1"},
		{loopback, []string{"Forwarded", `for=198.51.100.1;proto=https, for="[2001:db8::17]:4711"`}, "2001:db8::17"},
		{loopback, []string{"X-Forwarded-For", "10.0.0.1"}, "10.0.0.1"},
	} {
		var got string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = ClientAddr(r, c.trusted) }))
		get(t, srv.URL, c.headers...)
		srv.Close()
		if got != c.want {
			t.Errorf("trusted %v, headers %q: %q, want %q", c.trusted, c.headers, got, c.want)
		}
	}
}

// A client that goes away before the limiter answers gets nothing, and the
// ErrorHandler is not called for it.
func TestClientGoneIsNoError(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{Timeout: 5 * time.Second})
	called := false
	m := mustNew(t, l, Options{ErrorHandler: func(http.ResponseWriter, *http.Request, error) { called = true }, Limits: []Limit{{Window: time.Minute, Limit: 1}}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	m.Handler(&served{}).ServeHTTP(rec, req)
	if called {
		t.Errorf("the ErrorHandler was called for a client that left")
	}
}

// Under SkipSuccessful a success still in flight holds its slot until its
// refund: with a limit of 3 and three requests inside the handler, a fourth
// gets 429, and once they answered (and were refunded) the next is served.
// Catches a refund made before the handler answers (which would admit the
// fourth) and a refund that never comes.
func TestSkipSuccessfulInFlightHoldsASlot(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	entered := make(chan struct{}, 3)
	release := make(chan struct{})
	m := mustNew(t, l, Options{SkipSuccessful: true, Limits: []Limit{{Name: "slow", Window: time.Minute, Limit: 3}}})
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	statuses := make([]int, 3)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := get(t, srv.URL+"?hold=1")
			statuses[i] = resp.StatusCode
		}()
	}
	for range statuses {
		<-entered
	}
	if resp, _ := get(t, srv.URL); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("with 3 successes in flight, limit 3: %d, want 429", resp.StatusCode)
	}
	close(release)
	wg.Wait()
	if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != 200 {
		t.Errorf("the held requests: %v", statuses)
	}
	if n := redisServer.Do("ZCARD", "rl:slow:127.0.0.1").(int64); n != 0 {
		t.Errorf("after the successes answered, the window holds %d", n)
	}
	if resp, _ := get(t, srv.URL); resp.StatusCode != 200 {
		t.Errorf("after the refunds: %d", resp.StatusCode)
	}
}

// The handler reads the request's decision from its context: the same
// figures as the headers. Outside the middleware there is none.
func TestDecisionFromContext(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{})
	m := mustNew(t, l, Options{Limits: []Limit{{Window: time.Minute, Limit: 5}, {Name: "hour", Window: time.Hour, Limit: 100}}})
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := DecisionFromContext(r.Context())
		if !ok || len(d.Decisions) != 2 || !d.Allowed {
			http.Error(w, "no decision", 500)
			return
		}
		fmt.Fprintf(w, "%d %d %d", d.Binding.Remaining, d.Decisions[0].Remaining, d.Decisions[1].Remaining)
	})))
	defer srv.Close()
	for i := 0; i < 2; i++ {
		resp, body := get(t, srv.URL)
		if want := fmt.Sprintf("%d %d %d", 4-i, 4-i, 99-i); resp.StatusCode != 200 || body != want {
			t.Errorf("request %d: %d %q, want %q", i, resp.StatusCode, body, want)
		}
	}
	if _, ok := DecisionFromContext(context.Background()); ok {
		t.Errorf("a decision outside the middleware")
	}
}

// The default ErrorHandler says why it answers 500: the error goes to the
// standard logger (a new user with Redis down otherwise sees only 500s).
func TestDefaultErrorHandlerLogs(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	l := mustLimiter(t, redisServer.Client(), xcloak.Options{Timeout: 300 * time.Millisecond})
	srv, h := newServer(t, l, Options{Limits: []Limit{{Window: time.Minute, Limit: 10}}})
	redisServer.Kill()
	var logged strings.Builder
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	resp, _ := get(t, srv.URL+"/api/x")
	if resp.StatusCode != 500 || h.count() != 0 {
		t.Errorf("Redis down under PolicyRaise: %d, served %d", resp.StatusCode, h.count())
	}
	if !strings.Contains(logged.String(), "xcloak/nethttp: GET /api/x: xcloak: no answer from the server: ") {
		t.Errorf("logged %q", logged.String())
	}
}
