package bench

// The attack bench of the block cache (issue 32; docs/clients.md, Block
// cache): a credential-stuffing wave through the nethttp middleware on a
// real HTTP server (httptest, loopback), with the Limiter's block cache on
// and off in the same run, on one redis-server with the module.
//
//	cd clients/go/bench && go test -run '^$' -bench Attack -benchtime 1x
//
// Scale (environment): XCLOAK_ATTACK_IDENTITIES attack identities (default
// 100), each sent XCLOAK_ATTACK_ROUNDS requests (default 1,000: 100x its
// limit of 10 per 60 s), round-robin over the identities; one legitimate
// request every 20 attack requests, from identities that stay within the
// limit (5 requests each); XCLOAK_ATTACK_WORKERS concurrent HTTP clients
// (default 8). The 10,000 identities x 1,000 requests are
// 10,000,000 requests, too many for a shared 2-core machine; the ratios
// depend on requests per identity (100x the limit), which is kept.
//
// Three routes take the same traffic: the handler without the middleware
// (the latency baseline), the middleware with the cache, and without it
// (keys of their own). The traffic is cut into 10 slices, and each slice
// goes through the three routes one after the other, in a rotating order,
// so a burst of load on the shared machine falls on all three alike. Per
// route: Redis calls per request and server CPU per request (INFO
// commandstats deltas around each slice), this process's CPU per request
// (getrusage: the HTTP clients, the HTTP server and the middleware; on a
// machine shared with other work, requests per second mostly says how the
// OS shares its CPU between this process and redis-server), requests per
// second, p50 and p99
// of the time a request spends in the route's handler (the middleware
// included) minus the bare route's: the latency the middleware adds, without
// the HTTP clients' scheduling on a loaded machine; p50 and p99 at the
// client beside them; over-admission by the
// server's own record: every admission's stamp (the millisecond the server
// recorded it, from DecisionFromContext in the handler), and no 11 stamps
// of an identity within 60 s; ZCARD of each key at most 10; legitimate
// requests rejected. Then a cached rejection's cost against a server round
// trip, in this process: Allow of a blocked key answered by the cache, and
// Allow of it sent (cache off), in alternating blocks of 1,000; and the
// heap per entry of a Limiter holding 10,000 blocked keys. With
// XCLOAK_ATTACK_JSON=PATH the figures are also written there, in the shape
// every package's attack bench writes (scripts/bench gathers them).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
	"github.com/xcloak/xcloak/clients/go/nethttp"
)

const (
	attackLimit  = 10
	attackWindow = time.Minute
	legitEvery   = 20 // one legitimate request every 20 attack requests
	legitEach    = 5  // requests per legitimate identity (below the limit)
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type job struct {
	attack bool
	id     int
}

// phase is one pass of the whole traffic through one route.
type phase struct {
	name      string
	path      string
	limiter   *xcloak.Limiter // nil: the bare route
	keyPrefix string          // the middleware's keys: rl:<name>:
	latencies []time.Duration
	wall      time.Duration
	admitted  []int64 // per attack identity, as the clients saw
	legitRej  int64
	calls     int64 // XCLOAK.* calls
	usec      int64 // server CPU
	hits      uint64
	cpu       time.Duration // this process's CPU: HTTP clients, HTTP server, middleware
	verdict   string        // over-admission and legitimate rejections
	mu        sync.Mutex
	stamps    map[string][]int64 // per attack identity: its admissions' stamps
	inServer  []time.Duration    // each request's time in the route's handler, middleware included
}

func BenchmarkAttack(b *testing.B) {
	identities := envInt("XCLOAK_ATTACK_IDENTITIES", 100)
	rounds := envInt("XCLOAK_ATTACK_ROUNDS", 1000)
	workers := envInt("XCLOAK_ATTACK_WORKERS", 8)
	attackRequests := identities * rounds
	legitRequests := attackRequests / legitEvery
	legitIdentities := max(legitRequests/legitEach, 1)
	load := func() string {
		s, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(s))[:3], " ")
	}
	fmt.Printf("attack bench, %s; load average %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), load())
	fmt.Printf("%d attack identities x %d requests (limit %d per %v), %d legitimate requests from %d identities, %d HTTP clients\n",
		identities, rounds, attackLimit, attackWindow, legitRequests, legitIdentities, workers)

	server := testserver.Start(b, testserver.Config{})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true, PoolSize: 4 * workers})
	defer rdb.Close()
	ctx := context.Background()
	// A timeout is an outage, which this bench does not measure: on a shared
	// machine a call may wait for the CPU beyond the default 1 s.
	on, err := xcloak.NewLimiter(rdb, xcloak.Options{Fallback: xcloak.FallbackNever, Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	off, err := xcloak.NewLimiter(rdb, xcloak.Options{Fallback: xcloak.FallbackNever, Timeout: 10 * time.Second, BlockCache: -1})
	if err != nil {
		b.Fatal(err)
	}
	phases := []*phase{
		{name: "bare route", path: "/bare"},
		{name: "cache on", path: "/on", limiter: on, keyPrefix: "rl:on:"},
		{name: "cache off", path: "/off", limiter: off, keyPrefix: "rl:off:"},
	}
	identity := func(r *http.Request) (string, error) { return r.Header.Get("X-Identity"), nil }
	mux := http.NewServeMux()
	for _, p := range phases {
		p.stamps = map[string][]int64{}
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if m, ok := nethttp.DecisionFromContext(r.Context()); ok {
				id := r.Header.Get("X-Identity")
				p.mu.Lock()
				p.stamps[id] = append(p.stamps[id], m.Decisions[0].Stamp) // AllowAll asks for it
				p.mu.Unlock()
			}
			w.Write([]byte("ok"))
		})
		route := http.Handler(handler)
		if p.limiter != nil {
			mw, err := nethttp.New(p.limiter, nethttp.Options{Key: identity, Limits: []nethttp.Limit{{Name: p.path[1:], Window: attackWindow, Limit: attackLimit}}})
			if err != nil {
				b.Fatal(err)
			}
			route = mw.Handler(handler)
		}
		mux.Handle(p.path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t0 := time.Now()
			route.ServeHTTP(w, r)
			took := time.Since(t0)
			p.mu.Lock()
			p.inServer = append(p.inServer, took)
			p.mu.Unlock()
		}))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}}

	// The traffic, in order: round-robin over the attack identities, a
	// legitimate request every legitEvery.
	var jobs []job
	legit := 0
	for r := 0; r < rounds; r++ {
		for i := 0; i < identities; i++ {
			jobs = append(jobs, job{attack: true, id: i})
			if len(jobs)%(legitEvery+1) == legitEvery {
				jobs = append(jobs, job{id: legit % legitIdentities})
				legit++
			}
		}
	}

	send := func(path, id string) (int, error) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("X-Identity", id)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	xcloakStats := func() (calls, usec int64) {
		for command, st := range server.CommandStats() {
			if strings.HasPrefix(command, "xcloak.") {
				calls += st.Calls
			}
			usec += st.Usec
		}
		return calls, usec
	}
	for _, p := range phases {
		for w := 0; w < workers; w++ { // the connections made (keys of their own)
			if _, err := send(p.path, "warm"+strconv.Itoa(w)); err != nil {
				b.Fatal(err)
			}
		}
		p.admitted = make([]int64, identities)
		p.latencies = make([]time.Duration, len(jobs))
	}
	// run sends jobs[from:to] through p's route.
	run := func(p *phase, from, to int) {
		var hits0 uint64
		if p.limiter != nil {
			hits0 = p.limiter.Stats().CacheHits
		}
		calls0, usec0 := xcloakStats()
		cpu0 := cpuTime()
		next := atomic.Int64{}
		next.Store(int64(from))
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n := int(next.Add(1)) - 1
					if n >= to {
						return
					}
					j := jobs[n]
					id := "g" + strconv.Itoa(j.id)
					if j.attack {
						id = "a" + strconv.Itoa(j.id)
					}
					t0 := time.Now()
					status, err := send(p.path, id)
					p.latencies[n] = time.Since(t0)
					if err != nil {
						b.Error(err)
						return
					}
					switch {
					case j.attack && status == http.StatusOK:
						atomic.AddInt64(&p.admitted[j.id], 1)
					case !j.attack && status != http.StatusOK:
						atomic.AddInt64(&p.legitRej, 1)
					case status != http.StatusOK && status != http.StatusTooManyRequests:
						b.Errorf("%s: status %d", p.name, status)
					}
				}
			}()
		}
		wg.Wait()
		p.wall += time.Since(start)
		p.cpu += cpuTime() - cpu0
		calls1, usec1 := xcloakStats()
		p.calls += calls1 - calls0
		p.usec += usec1 - usec0
		if p.limiter != nil {
			p.hits += p.limiter.Stats().CacheHits - hits0
		}
	}
	const slices = 10
	for k := 0; k < slices; k++ {
		from, to := k*len(jobs)/slices, (k+1)*len(jobs)/slices
		for i := range phases {
			run(phases[(i+k)%len(phases)], from, to)
		}
	}
	for _, p := range phases {
		sort.Slice(p.latencies, func(i, j int) bool { return p.latencies[i] < p.latencies[j] })
		sort.Slice(p.inServer, func(i, j int) bool { return p.inServer[i] < p.inServer[j] })
	}
	pct := func(d []time.Duration, q float64) time.Duration { return d[min(int(q*float64(len(d))), len(d)-1)] }

	bare := phases[0]
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

	fmt.Printf("\n| | cache on | cache off |\n|---|---|---|\n")
	row := func(name string, f func(p *phase) string) {
		fmt.Printf("| %s | %s | %s |\n", name, f(phases[1]), f(phases[2]))
	}
	total := float64(len(jobs))
	row("Redis calls per request", func(p *phase) string { return fmt.Sprintf("%.3f", float64(p.calls)/total) })
	row("Redis calls per attack request", func(p *phase) string {
		return fmt.Sprintf("%.4f", float64(p.calls-int64(legitRequests))/float64(attackRequests))
	})
	row("attack rejections answered without a call", func(p *phase) string {
		var admitted int64
		for _, n := range p.admitted {
			admitted += n
		}
		return fmt.Sprintf("%.2f%% (%d of %d)", 100*float64(p.hits)/float64(int64(attackRequests)-admitted), p.hits, int64(attackRequests)-admitted)
	})
	row("server CPU per request (commandstats)", func(p *phase) string {
		return fmt.Sprintf("%.2f µs (%.0f ms in all)", float64(p.usec)/total, float64(p.usec)/1e3)
	})
	row("CPU per request, this process (HTTP clients and server, middleware; bare route)", func(p *phase) string {
		return fmt.Sprintf("%.1f µs (%.1f µs)", float64(p.cpu.Nanoseconds())/1e3/total, float64(bare.cpu.Nanoseconds())/1e3/total)
	})
	row("requests per second", func(p *phase) string {
		return fmt.Sprintf("%.0f (bare route %.0f)", total/p.wall.Seconds(), total/bare.wall.Seconds())
	})
	row("latency added in the server, p50 / p99", func(p *phase) string {
		return us(pct(p.inServer, 0.50)-pct(bare.inServer, 0.50)) + " / " + us(pct(p.inServer, 0.99)-pct(bare.inServer, 0.99))
	})
	row("latency at the client, p50 / p99 (bare route)", func(p *phase) string {
		return fmt.Sprintf("%s / %s (%s / %s)", us(pct(p.latencies, 0.50)), us(pct(p.latencies, 0.99)), us(pct(bare.latencies, 0.50)), us(pct(bare.latencies, 0.99)))
	})
	// Over-admission, by the server's own record: the stamps of the
	// admissions (the milliseconds the server recorded them; live while
	// above now - window), and no identity with 11 of them within the
	// window. ZCARD of each key (live entries, and expired ones not yet
	// trimmed) is at most the limit.
	for _, p := range phases[1:] {
		over, stamped, zcardOver := 0, int64(0), 0
		var admitted int64
		for i, n := range p.admitted {
			admitted += n
			st := p.stamps["a"+strconv.Itoa(i)]
			sort.Slice(st, func(a, b int) bool { return st[a] < st[b] })
			stamped += int64(len(st))
			for k := 0; k+attackLimit < len(st); k++ {
				if st[k+attackLimit]-st[k] < attackWindow.Milliseconds() {
					over++
				}
			}
			z, err := rdb.ZCard(ctx, p.keyPrefix+"a"+strconv.Itoa(i)).Result()
			if err != nil {
				b.Fatal(err)
			}
			if z > attackLimit {
				zcardOver++
			}
		}
		if over != 0 || zcardOver != 0 || stamped != admitted || p.legitRej != 0 {
			b.Errorf("%s: %d over-admissions, %d keys above the limit, %d stamps for %d admissions, %d legitimate rejected",
				p.name, over, zcardOver, stamped, admitted, p.legitRej)
		}
		p.verdict = fmt.Sprintf("%d (%d admissions, %d keys above %d); %d", over, admitted, zcardOver, attackLimit, p.legitRej)
	}
	row("over-admission; legitimate rejected", func(p *phase) string { return p.verdict })

	// A cached rejection against a server round trip, in this process:
	// alternating blocks of calls on one blocked key.
	for i := 0; i < 2; i++ {
		if _, err := on.Allow(ctx, "cost", time.Minute, 1); err != nil {
			b.Fatal(err)
		}
	}
	const blocks, block = 20, 1000
	var cachedT, sentT time.Duration
	for k := 0; k < blocks; k++ {
		for which, l := range []*xcloak.Limiter{on, off} {
			if k%2 == 1 {
				l = []*xcloak.Limiter{off, on}[which]
			}
			t0 := time.Now()
			for n := 0; n < block; n++ {
				d, err := l.Allow(ctx, "cost", time.Minute, 1)
				if err != nil || d.Allowed || (l == on) != (d.Via == xcloak.ViaCache) {
					b.Fatalf("%+v, %v", d, err)
				}
			}
			if l == on {
				cachedT += time.Since(t0)
			} else {
				sentT += time.Since(t0)
			}
		}
	}
	perCached := float64(cachedT.Nanoseconds()) / (blocks * block)
	perSent := float64(sentT.Nanoseconds()) / (blocks * block)
	fmt.Printf("a cached rejection: %.0f ns per Allow; a rejection sent to the server: %.0f ns; ratio 1/%.0f\n", perCached, perSent, perSent/perCached)
	// Memory per entry through a Limiter (runtime.ReadMemStats after GC):
	// 10,000 keys of 24 bytes blocked by the server, no tiers.
	const entries = 10_000
	// The prefix makes each call build its key (prefix + key), as in use: the
	// entry's key is counted.
	mem, err := xcloak.NewLimiter(rdb, xcloak.Options{Prefix: "rl:", Fallback: xcloak.FallbackNever, Timeout: 10 * time.Second, BlockCache: entries})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, entries)
	for i := range keys {
		keys[i] = fmt.Sprintf("login:%015d", i) // rl:login:... is 24 bytes
		if _, err := mem.Allow(ctx, keys[i], time.Minute, 1); err != nil {
			b.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, key := range keys {
		if d, err := mem.Allow(ctx, key, time.Minute, 1); err != nil || d.Allowed {
			b.Fatal(d, err)
		}
	}
	keys = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	if st := mem.Stats(); st.CacheEntries != entries {
		b.Fatalf("%+v", st)
	}
	perEntry := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / entries
	runtime.KeepAlive(mem)
	fmt.Printf("memory per entry (through a Limiter, %d entries, 24-byte keys, no tiers): %.0f bytes\n", entries, perEntry)
	fmt.Printf("load average at the end %s\n", load())
	if path := os.Getenv("XCLOAK_ATTACK_JSON"); path != "" {
		mode := func(p *phase) map[string]interface{} {
			var admitted int64
			for _, n := range p.admitted {
				admitted += n
			}
			over := 0
			fmt.Sscanf(p.verdict, "%d", &over)
			return map[string]interface{}{
				"calls_per_request":        float64(p.calls) / total,
				"calls_per_attack_request": float64(p.calls-int64(legitRequests)) / float64(attackRequests),
				"cache_answered_share":     float64(p.hits) / float64(int64(attackRequests)-admitted),
				"server_usec_per_request":  float64(p.usec) / total,
				"rps":                      total / p.wall.Seconds(),
				"p50_ms":                   float64(pct(p.inServer, 0.50)-pct(bare.inServer, 0.50)) / 1e6,
				"p99_ms":                   float64(pct(p.inServer, 0.99)-pct(bare.inServer, 0.99)) / 1e6,
				"overadmitted":             over,
				"legit_rejected":           p.legitRej,
			}
		}
		loadNow, _ := strconv.ParseFloat(strings.Fields(load())[0], 64)
		out := map[string]interface{}{
			"package": "go", "middleware": "nethttp (net/http, httptest on loopback)",
			"when": time.Now().UTC().Format("2006-01-02T15:04:05Z"), "load": loadNow,
			"scale": map[string]interface{}{
				"identities": identities, "attack_per_identity": rounds, "legit_identities": legitIdentities,
				"legit_per_identity": legitEach, "requests": len(jobs), "rounds": 1,
			},
			"on": mode(phases[1]), "off": mode(phases[2]),
			"cached_ns": perCached, "roundtrip_ns": perSent, "cached_vs_roundtrip": perCached / perSent,
			"bytes_per_entry": perEntry,
		}
		data, _ := json.MarshalIndent(out, "", " ")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(phases[1].calls-int64(legitRequests))/float64(attackRequests), "on-calls/attack-req")
	b.ReportMetric(perSent/perCached, "roundtrip/cached")
}
