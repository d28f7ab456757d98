package ratelimit_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

const blockCacheConfig = `
domain: bc
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: watch
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
`

// The Limiter's block cache in the service (XCLOAK_BLOCK_CACHE, default
// 10,000): a descriptor over its limit is answered OVER_LIMIT from the
// cache with no call, and counted in over_limit as a server rejection is;
// a shadow_mode descriptor answered by the cache is still OK, and counted
// in shadow_mode; /metrics shows the hits; XCLOAK_BLOCK_CACHE=0 sends every
// request. Catches a cached rejection that escapes shadow mode, counters
// that miss the cached rejections, and a setting that does not reach the
// Limiter.
func TestBlockCache(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	for _, cache := range []string{"", "0"} {
		s := start(t, redisServer.Addr(), map[string]string{"bc.yaml": blockCacheConfig}, map[string]string{"XCLOAK_BLOCK_CACHE": cache})
		user, watch := "user="+cache, "watch="+cache
		calls := redisServer.Calls("xcloak.allow")
		for i := 0; i < 6; i++ {
			r := s.call("bc", d(user))
			want := pb.RateLimitResponse_OK
			if i >= 2 {
				want = pb.RateLimitResponse_OVER_LIMIT
			}
			if r.OverallCode != want || r.Statuses[0].Code != want || (i >= 2 && r.Statuses[0].DurationUntilReset.AsDuration() <= 0) {
				t.Fatalf("XCLOAK_BLOCK_CACHE=%q: call %d: %v", cache, i, r)
			}
		}
		for i := 0; i < 6; i++ {
			if r := s.call("bc", d(watch)); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OK {
				t.Fatalf("XCLOAK_BLOCK_CACHE=%q: shadow call %d: %v", cache, i, r)
			}
		}
		sent := redisServer.Calls("xcloak.allow") - calls
		if want := map[string]int64{"": 2 + 1 + 1 + 1, "0": 12}[cache]; sent != want {
			t.Errorf("XCLOAK_BLOCK_CACHE=%q: %d calls for 12 requests, want %d", cache, sent, want)
		}
		if total, over, _, within, _ := s.srv.Service.Metrics().Snapshot("bc.user"); total != 6 || over != 4 || within != 2 {
			t.Errorf("XCLOAK_BLOCK_CACHE=%q: user: total %d, over %d, within %d; want 6, 4, 2", cache, total, over, within)
		}
		if total, over, _, _, shadow := s.srv.Service.Metrics().Snapshot("bc.watch"); total != 6 || over != 5 || shadow != 5 {
			t.Errorf("XCLOAK_BLOCK_CACHE=%q: watch: total %d, over %d, shadow %d; want 6, 5, 5", cache, total, over, shadow)
		}
		resp, err := http.Get("http://" + s.srv.HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := map[string]string{"": "xcloak_block_cache_hits 7\n", "0": "xcloak_block_cache_hits 0\n"}[cache]; !strings.Contains(string(page), want) {
			t.Errorf("XCLOAK_BLOCK_CACHE=%q: /metrics lacks %q", cache, want)
		}
	}
}
