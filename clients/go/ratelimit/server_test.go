package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
	"github.com/xcloak/xcloak/clients/go/ratelimit"
	"github.com/xcloak/xcloak/clients/go/ratelimit/config"
)

const loginConfig = `
domain: login
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: %d}
`

func limitOf(t *testing.T, s *service) uint32 {
	t.Helper()
	r := s.call("login", d("user=probe"))
	if r.Statuses[0].CurrentLimit == nil {
		t.Fatal("no limit applied")
	}
	return r.Statuses[0].CurrentLimit.RequestsPerUnit
}

// A bad file is refused with its line, the last good configuration keeps
// serving, and a good file is picked up, while calls go on: none fails.
func TestReloadUnderLoad(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	s := start(t, redisServer.Addr(), map[string]string{"login.yaml": strings.ReplaceAll(loginConfig, "%d", "1000")}, nil)
	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.try(&pb.RateLimitRequest{Domain: "login", Descriptors: []*rlsCommonDescriptor{d("user=load")}})
				calls.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	m := s.srv.Service.Metrics()
	errorsBefore := m.ConfigLoadError.Load()
	s.write("login.yaml", "domain: login\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	if !testserver.Eventually(10*time.Second, func() bool { return m.ConfigLoadError.Load() > errorsBefore }) {
		t.Fatal("the bad file was never read")
	}
	if got := limitOf(t, s); got != 1000 {
		t.Fatalf("after a bad file the limit is %d, want the last good 1000", got)
	}
	s.write("login.yaml", strings.ReplaceAll(loginConfig, "%d", "7"))
	if !testserver.Eventually(10*time.Second, func() bool { return limitOf(t, s) == 7 }) {
		t.Fatal("the good file was never picked up")
	}
	close(stop)
	wg.Wait()
	if failures.Load() != 0 || calls.Load() == 0 {
		t.Fatalf("%d of %d calls failed during the reloads (first: %v)", failures.Load(), calls.Load(), firstErr.Load())
	}
}

// A bad configuration refuses the start, with the file, the line and the reason.
func TestBadConfigurationRefusesTheStart(t *testing.T) {
	dir := t.TempDir()
	bad := "domain: login\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5000000\n"
	if err := os.WriteFile(filepath.Join(dir, "login.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := ratelimit.LoadSettings(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	s.ConfigDir = dir
	rdb := s.RedisClient()
	defer rdb.Close()
	_, err = ratelimit.NewServer(s, rdb, slog.New(slog.NewTextHandler(io.Discard, nil)))
	want := filepath.Join(dir, "login.yaml") + ":6: requests_per_unit must be an integer from 0 to 1000000"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want %q...", err, want)
	}
}

func TestConfigurationErrorsNameTheLine(t *testing.T) {
	cases := []struct{ text, want string }{
		{"domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "f.yaml:4: invalid rate limit unit 'fortnight'"},
		{"domain: x\ndescriptors:\n  - key: a\n    ratelimit: {unit: second}\n", "f.yaml:4: config error, unknown key 'ratelimit'"},
		{"domain: x\ndescriptors:\n  - value: a\n", "f.yaml:3: descriptor has empty key"},
		{"domain: x\ndescriptors:\n  - key: a\n  - key: a\n", "f.yaml:4: duplicate descriptor composite key 'x.a'"},
		{"descriptors: []\n", "f.yaml:1: config file cannot have empty domain"},
		{"domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", "f.yaml:4: should not specify rate limit unit when unlimited"},
		{"domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: n}]\n",
			"f.yaml:8: replaces should not contain name of same descriptor"},
		{"domain: x\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "f.yaml:5: share_threshold can only be used with wildcard values"},
		{"domain: x\ndescriptors:\n  - key: a\n    quota_mode: true\n", "f.yaml:4: quota_mode is not supported"},
		{"domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "f.yaml:4: requests_per_unit must be an integer from 0 to 1000000"},
		{"domain: x\ndescriptors:\n  - key: a\n   bad indent\n", "f.yaml:2: error loading config file: did not find expected"},
	}
	for _, c := range cases {
		_, err := config.Parse(map[string][]byte{"f.yaml": []byte(c.text)}, config.Options{})
		var ce *config.Error
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q...", c.text, err, c.want)
		}
	}
	// Two files with one domain are refused, unless MERGE_DOMAIN_CONFIG.
	files := map[string][]byte{"a.yaml": []byte("domain: x\ndescriptors: [{key: a}]\n"), "b.yaml": []byte("domain: x\ndescriptors: [{key: b}]\n")}
	if _, err := config.Parse(files, config.Options{}); err == nil || !strings.Contains(err.Error(), "b.yaml:1: duplicate domain 'x'") {
		t.Errorf("a domain in two files: %v", err)
	}
	if _, err := config.Parse(files, config.Options{MergeDomains: true}); err != nil {
		t.Errorf("merged domains: %v", err)
	}
}

func TestJSONHealthAndMetrics(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	s := start(t, redisServer.Addr(), map[string]string{"login.yaml": strings.ReplaceAll(loginConfig, "%d", "1")}, nil)
	base := "http://" + s.srv.HTTPAddr()
	post := func() (int, string) {
		body := `{"domain":"login","descriptors":[{"entries":[{"key":"user","value":"json"}]}]}`
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	if code, body := post(); code != 200 || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Fatalf("/json first: %d %s", code, body)
	}
	if code, body := post(); code != 429 || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("/json second: %d %s", code, body)
	}
	resp, err := http.Get(base + "/healthcheck")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthcheck: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="login",key1="user"} 2`,
		`ratelimit_service_rate_limit_over_limit{domain="login",key1="user"} 1`,
		`ratelimit_service_rate_limit_within_limit{domain="login",key1="user"} 1`,
		`ratelimit_service_config_load_success 1`,
	} {
		if !bytes.Contains(text, []byte(want)) {
			t.Fatalf("/metrics lacks %q:\n%s", want, text)
		}
	}
	conn, err := grpc.NewClient(s.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health: %v %v", h, err)
	}
}

// With LIMIT_RESPONSE_HEADERS_ENABLED the response carries the rate limit
// fields, renamed as configured, and Retry-After on a rejection.
func TestResponseHeaders(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	s := start(t, redisServer.Addr(), map[string]string{"login.yaml": strings.ReplaceAll(loginConfig, "%d", "2")},
		map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left"})
	headers := func(r *pb.RateLimitResponse) map[string]string {
		out := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			out[h.Key] = h.Value
		}
		return out
	}
	h := headers(s.call("login", d("user=h")))
	if h["RateLimit-Limit"] != "2" || h["X-Left"] != "1" || h["RateLimit-Reset"] != "60" || h["Retry-After"] != "" {
		t.Fatalf("admitted: %v", h)
	}
	s.call("login", d("user=h"))
	h = headers(s.call("login", d("user=h")))
	if h["X-Left"] != "0" || h["Retry-After"] == "" || h["Retry-After"] == "0" {
		t.Fatalf("rejected: %v", h)
	}
}

// An outage is a gRPC error (Envoy's failure_mode_deny decides), unless the
// error policy answers; a configuration error is never an outage.
func TestOutages(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	cfg := map[string]string{"login.yaml": strings.ReplaceAll(loginConfig, "%d", "5")}
	plain := start(t, redisServer.Addr(), cfg, map[string]string{"XCLOAK_TIMEOUT": "200ms"})
	open := start(t, redisServer.Addr(), cfg, map[string]string{"XCLOAK_TIMEOUT": "200ms", "XCLOAK_ON_ERROR": "allow"})
	plain.call("login", d("user=o")) // connections and scripts ready
	open.call("login", d("user=o"))
	redisServer.Pause()
	defer redisServer.Resume()
	if _, err := plain.try(&pb.RateLimitRequest{Domain: "login", Descriptors: []*rlsCommonDescriptor{d("user=o")}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a paused server: %v, want Unavailable", err)
	}
	r, err := open.try(&pb.RateLimitRequest{Domain: "login", Descriptors: []*rlsCommonDescriptor{d("user=o")}})
	if err != nil || r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("a paused server under XCLOAK_ON_ERROR=allow: %v %v", r, err)
	}
	if plain.srv.Service.Metrics().RedisError.Load() == 0 {
		t.Fatal("the outage was not counted")
	}
}

func TestSettings(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	s, err := ratelimit.LoadSettings(env(map[string]string{
		"RUNTIME_ROOT": "/srv/runtime_data/current", "RUNTIME_SUBDIRECTORY": "ratelimit", "USE_STATSD": "true",
		"LOCAL_CACHE_SIZE_IN_BYTES": "1000", "GRPC_PORT": "9000", "REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if s.ConfigDir != "/srv/runtime_data/current/ratelimit/config" || s.GRPCAddr != "0.0.0.0:9000" || s.HTTPAddr != "0.0.0.0:8080" || s.RedisType != "CLUSTER" {
		t.Fatalf("settings: %+v", s)
	}
	if s.GRPCMaxConnectionAge != 24*time.Hour || s.GRPCMaxConnectionAgeGrace != time.Hour {
		t.Fatalf("GRPC_MAX_CONNECTION_AGE defaults: %v, %v", s.GRPCMaxConnectionAge, s.GRPCMaxConnectionAgeGrace)
	}
	if strings.Join(s.Ignored, ",") != "LOCAL_CACHE_SIZE_IN_BYTES,USE_STATSD" {
		t.Fatalf("ignored: %v", s.Ignored)
	}
	// The reference's defaults: RUNTIME_ROOT /srv/runtime_data/current, and
	// its runtime variables are said to be ignored, not silently dropped.
	s, err = ratelimit.LoadSettings(env(map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	if s.ConfigDir != "/srv/runtime_data/current/ratelimit/config" || strings.Join(s.Ignored, ",") != "RUNTIME_IGNOREDOTFILES,RUNTIME_WATCH_ROOT" {
		t.Fatalf("defaults: config %q, ignored %v", s.ConfigDir, s.Ignored)
	}
	for name, value := range map[string]string{
		"REDIS_TYPE": "ring", "NEAR_LIMIT_RATIO": "2", "XCLOAK_ON_ERROR": "open", "REDIS_POOL_SIZE": "0",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "yes please", "GRPC_MAX_CONNECTION_AGE": "a day", "BACKEND_TYPE": "memcache", "XCLOAK_TIMEOUT": "-1s",
		"XCLOAK_MAX_STATS_KEYS": "0", "XCLOAK_BLOCK_CACHE": "-1",
	} {
		_, err := ratelimit.LoadSettings(env(map[string]string{name: value}))
		if err == nil || !strings.HasPrefix(err.Error(), name+": ") {
			t.Errorf("%s=%s: got %v, want an error naming %s", name, value, err, name)
		}
	}
}

// A Kubernetes ConfigMap volume: the files are symlinks through "..data",
// and an update swaps that symlink to a new directory. The swap is a change.
func TestConfigMapSymlinkSwap(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	s := start(t, redisServer.Addr(), nil, nil)
	version := func(n int, limit string) {
		dir := filepath.Join(s.dir, "..2026_12_03_v"+limit)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "login.yaml"), []byte(strings.ReplaceAll(loginConfig, "%d", limit)), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(s.dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(dir), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if err := os.Symlink("..data/login.yaml", filepath.Join(s.dir, "login.yaml")); err != nil {
				t.Fatal(err)
			}
		}
	}
	version(0, "3")
	if !testserver.Eventually(10*time.Second, func() bool { return s.srv.Service.Config().Limits == 1 && limitOf(t, s) == 3 }) {
		t.Fatal("the first version was never loaded")
	}
	version(1, "8")
	if !testserver.Eventually(10*time.Second, func() bool { return limitOf(t, s) == 8 }) {
		t.Fatal("the swapped version was never loaded")
	}
}
