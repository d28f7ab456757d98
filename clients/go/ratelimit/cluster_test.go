package ratelimit_test

import (
	"fmt"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

const twoDescriptors = `
domain: api
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: address
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// On a 3+3 cluster (REDIS_TYPE=CLUSTER), through the module and through the
// script: a request's descriptors sit on different slots and are decided all
// or nothing, every call goes straight to its key's node (0 MOVED), and a
// Sentinel deployment (REDIS_TYPE=SENTINEL) serves the same way.
func TestClusterAllOrNothingAcrossSlots(t *testing.T) {
	cluster := testserver.StartCluster(t, []testserver.Config{{}, {}, {}}, 1)
	for _, fallback := range []string{"never", "always"} {
		t.Run(fallback, func(t *testing.T) {
			s := start(t, strings.Join(cluster.Addrs(), ","), map[string]string{"api.yaml": twoDescriptors},
				map[string]string{"REDIS_TYPE": "CLUSTER", "XCLOAK_FALLBACK": fallback, "CACHE_KEY_PREFIX": fallback + ":"})
			cluster.ResetStats()
			// An address whose window lives on another node than the account's.
			ip := ""
			for n := 1; n < 100 && ip == ""; n++ {
				if candidate := fmt.Sprintf("10.0.0.%d", n); cluster.Owner(fallback+":api_address_"+candidate) != cluster.Owner(fallback+":api_account_alice") {
					ip = candidate
				}
			}
			account, address := d("account=alice"), d("address="+ip)
			for i := 0; i < 3; i++ {
				if r := s.call("api", account, address); r.OverallCode != pb.RateLimitResponse_OK {
					t.Fatalf("call %d: %v", i, r.OverallCode)
				}
			}
			r := s.call("api", account, address)
			expect(t, "account over", r.Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 3, 0)
			expect(t, "address untouched", r.Statuses[1], pb.RateLimitResponse_OK, 100, 97)
			expect(t, "address alone", s.call("api", address).Statuses[0], pb.RateLimitResponse_OK, 100, 96)
			if moved := testserver.Sum(cluster.Nodes, "errorstats", "errorstat_MOVED", "count"); moved != 0 {
				t.Fatalf("%d MOVED", moved)
			}
		})
	}
}

func TestSentinel(t *testing.T) {
	sentinel := testserver.StartSentinel(t, testserver.Config{}, 1, 1)
	s := start(t, testserver.MasterName+","+strings.Join(sentinel.SentinelAddrs(), ","), map[string]string{"api.yaml": twoDescriptors},
		map[string]string{"REDIS_TYPE": "SENTINEL"})
	for i := 3; i > 0; i-- {
		expect(t, "sentinel", s.call("api", d("account=s")).Statuses[0], pb.RateLimitResponse_OK, 3, uint32(i-1))
	}
	expect(t, "sentinel over", s.call("api", d("account=s")).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 3, 0)
}
