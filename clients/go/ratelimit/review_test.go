package ratelimit_test

import (
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

func headerMap(r *pb.RateLimitResponse) map[string]string {
	out := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		out[h.Key] = h.Value
	}
	return out
}

// A response answered OK carries no Retry-After: Envoy adds the response's
// headers to a request it lets through, and a client told to retry after a
// minute on a 200 backs off for nothing. A descriptor over its limit in
// shadow_mode, or any rejection under SHADOW_MODE, is answered OK. Fails
// when Retry-After follows the binding decision rather than the answer.
func TestNoRetryAfterOnAnOKAnswer(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	shadowConfig := `
domain: rl
descriptors:
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: enforced
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	s := start(t, redisServer.Addr(), map[string]string{"rl.yaml": shadowConfig},
		map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"})
	s.call("rl", d("shadowed=a"))
	r := s.call("rl", d("shadowed=a"))
	h := headerMap(r)
	if r.OverallCode != pb.RateLimitResponse_OK || h["RateLimit-Remaining"] != "0" || h["Retry-After"] != "" {
		t.Fatalf("shadow_mode over its limit: %v %v", r.OverallCode, h)
	}

	global := start(t, redisServer.Addr(), map[string]string{"rl.yaml": shadowConfig},
		map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "SHADOW_MODE": "true", "CACHE_KEY_PREFIX": "g:"})
	global.call("rl", d("enforced=a"))
	r = global.call("rl", d("enforced=a"))
	h = headerMap(r)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT || h["Retry-After"] != "" {
		t.Fatalf("SHADOW_MODE, over the limit: %v %v %v", r.OverallCode, r.Statuses[0].Code, h)
	}
}

// The reference looks a request's domain up before its limit override: in
// a domain no file configures, the override is ignored and the descriptor is
// answered OK without a limit (checked against envoyproxy/ratelimit at
// 3fb7025: two calls with an override of 1 per minute in an unknown domain,
// both OK, no current_limit). Fails when the override is applied there.
func TestOverrideInAnUnknownDomainIsIgnored(t *testing.T) {
	redisServer := testserver.Start(t, testserver.Config{})
	s := start(t, redisServer.Addr(), map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"}, nil)
	override := func() *rlsCommonDescriptor {
		desc := d("user=o")
		desc.Limit = &rlsCommonOverride{RequestsPerUnit: 1, Unit: rlsCommonUnitMinute}
		return desc
	}
	for i := 0; i < 2; i++ {
		r := s.call("unknown", override())
		if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("call %d in an unknown domain: %v", i+1, r)
		}
	}
	s.call("rl", override())
	if r := s.call("rl", override()); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("the second call over the override in a configured domain: %v", r)
	}
}

// The same entries sent with a limit override and without (another route,
// the configured limit) are two windows of different lengths: sharing one
// sorted set, the shorter window's trimming drops the longer one's entries
// and the override admits more than its limit. Here the configured call
// (1 per minute) must not count against the override (5 per hour), nor the
// override against the configured limit. Fails when both use one key.
func TestOverrideAndConfiguredLimitKeepSeparateWindows(t *testing.T) {
	for name, redisServer := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := start(t, redisServer.Addr(), map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"}, nil)
			if r := s.call("rl", d("user=w")); r.OverallCode != pb.RateLimitResponse_OK {
				t.Fatalf("configured limit, first call: %v", r)
			}
			hourly := d("user=w")
			hourly.Limit = &rlsCommonOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR}
			r := s.call("rl", hourly)
			if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
				t.Fatalf("override, first call: want OK with 4 remaining, got %v", r)
			}
			if r := s.call("rl", d("user=w")); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("configured limit, second call: want OVER_LIMIT, got %v", r)
			}
		})
	}
}
