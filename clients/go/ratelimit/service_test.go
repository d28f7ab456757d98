package ratelimit_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The configuration examples of envoyproxy/ratelimit's README ("Examples"
// 1 to 11), as files of one directory.
var readmeExamples = map[string]string{
	"example1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2.yaml": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4.yaml": `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`,
	"example5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example10.yaml": `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`,
	"example11.yaml": `
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
`,
}

func expect(t *testing.T, what string, st *pb.RateLimitResponse_DescriptorStatus, code pb.RateLimitResponse_Code, limit uint32, remaining uint32) {
	t.Helper()
	got := uint32(0)
	if st.CurrentLimit != nil {
		got = st.CurrentLimit.RequestsPerUnit
	}
	if st.Code != code || got != limit || st.LimitRemaining != remaining {
		t.Fatalf("%s: got %v limit %d remaining %d, want %v limit %d remaining %d", what, st.Code, got, st.LimitRemaining, code, limit, remaining)
	}
}

func TestReadmeExamples(t *testing.T) {
	for name, redisServer := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := start(t, redisServer.Addr(), readmeExamples, nil)
			ok, over := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT

			// 1: key and value; an unknown value has no limit.
			r := s.call("mongo_cps", d("database=users"))
			expect(t, "example 1", r.Statuses[0], ok, 500, 499)
			if r.Statuses[0].CurrentLimit.Unit != pb.RateLimitResponse_RateLimit_SECOND {
				t.Fatalf("example 1: unit %v", r.Statuses[0].CurrentLimit.Unit)
			}
			expect(t, "example 1, unknown value", s.call("mongo_cps", d("database=other")).Statuses[0], ok, 0, 0)

			// 2: two descriptors in one call; the nested one binds at 5, and
			// the sixth call consumes neither (all or nothing).
			for i := 1; i <= 5; i++ {
				r = s.call("messaging", d("message_type=marketing", "to_number=2061111111"), d("to_number=2061111111"))
				expect(t, "example 2 nested", r.Statuses[0], ok, 5, uint32(5-i))
				expect(t, "example 2 number", r.Statuses[1], ok, 100, uint32(100-i))
			}
			r = s.call("messaging", d("message_type=marketing", "to_number=2061111111"), d("to_number=2061111111"))
			if r.OverallCode != over {
				t.Fatalf("example 2: sixth call %v", r.OverallCode)
			}
			expect(t, "example 2 nested, rejected", r.Statuses[0], over, 5, 0)
			expect(t, "example 2 number, not consumed", r.Statuses[1], ok, 100, 95)
			// The other order: the number is admitted first, then refunded.
			r = s.call("messaging", d("to_number=2061111111"), d("message_type=marketing", "to_number=2061111111"))
			expect(t, "example 2 number first, refunded", r.Statuses[0], ok, 100, 95)
			expect(t, "example 2 nested second, rejected", r.Statuses[1], over, 5, 0)
			expect(t, "example 2 number alone", s.call("messaging", d("to_number=2061111111")).Statuses[0], ok, 100, 94)
			expect(t, "example 2, another number", s.call("messaging", d("to_number=2062222222")).Statuses[0], ok, 100, 99)

			// 3: the most specific match; a limit of 0 rejects without a call.
			expect(t, "example 3", s.call("edge_proxy_per_ip", d("remote_address=50.0.0.1")).Statuses[0], ok, 10, 9)
			before := redisServer.Calls("evalsha") + redisServer.Calls("xcloak.allow")
			r = s.call("edge_proxy_per_ip", d("remote_address=50.0.0.5"))
			expect(t, "example 3 blocked", r.Statuses[0], over, 0, 0)
			if after := redisServer.Calls("evalsha") + redisServer.Calls("xcloak.allow"); after != before {
				t.Fatalf("example 3: a limit of 0 sent %d calls", after-before)
			}

			// 4: a request deeper than the configuration matches nothing.
			expect(t, "example 4", s.call("example4", d("key=value", "subkey=subvalue")).Statuses[0], ok, 0, 0)
			expect(t, "example 4 same depth", s.call("example4", d("key=value")).Statuses[0], ok, 300, 299)

			// 5: unlimited: OK with MaxUint32 remaining, nothing sent.
			r = s.call("internal", d("ldap=x"))
			if r.Statuses[0].Code != ok || r.Statuses[0].LimitRemaining != math.MaxUint32 {
				t.Fatalf("example 5: %v", r.Statuses[0])
			}
			expect(t, "example 5 azure", s.call("internal", d("azure=x")).Statuses[0], ok, 100, 99)

			// 6: shadow mode answers OK past the limit and counts it.
			for i := 0; i < 12; i++ {
				r = s.call("example6", d("service=auth", "user=user-a"))
				if r.OverallCode != ok {
					t.Fatalf("example 6: call %d in shadow mode answered %v", i, r.OverallCode)
				}
			}
			if _, _, _, _, shadow := s.srv.Service.Metrics().Snapshot("example6.service.user_user-a"); shadow != 2 {
				t.Fatalf("example 6: shadow_mode counted %d, want 2", shadow)
			}
			expect(t, "example 6 user-b", s.call("example6", d("service=auth", "user=user-b")).Statuses[0], ok, 20, 19)

			// 7: replaces: with both descriptors, only the replacing limit applies,
			// and the replaced window is not touched.
			for i := 1; i <= 10; i++ {
				r = s.call("example7", d("key_1=value_1", "user=bkthomps"), d("key_2=value_2", "user=bkthomps"))
				expect(t, "example 7 replaced", r.Statuses[0], ok, 0, 0)
				expect(t, "example 7 replacing", r.Statuses[1], ok, 10, uint32(10-i))
			}
			expect(t, "example 7 alone", s.call("example7", d("key_1=value_1", "user=bkthomps")).Statuses[0], ok, 5, 4)

			// 8: detailed_metric counts per value.
			s.call("example8", d("key1=unspecified_value"))
			if total, _, _, _, _ := s.srv.Service.Metrics().Snapshot("example8.key1_unspecified_value"); total != 1 {
				t.Fatalf("example 8: detailed metric counted %d", total)
			}

			// 9: wildcards, trailing, middle and several.
			expect(t, "example 9 trailing", s.call("example9", d("key1=valueXYZ")).Statuses[0], ok, 20, 19)
			expect(t, "example 9 middle", s.call("example9", d("path=/api/123/action")).Statuses[0], ok, 20, 19)
			expect(t, "example 9 middle, no match", s.call("example9", d("path=/api/123/other")).Statuses[0], ok, 0, 0)
			expect(t, "example 9 several", s.call("example9", d("route=/api/v1/resource/7/action")).Statuses[0], ok, 20, 19)

			// 10: value_to_metric puts the runtime values in the counters' key.
			s.call("example10", d("route=api", "http_method=GET", "subject_id=123"))
			if total, _, _, _, _ := s.srv.Service.Metrics().Snapshot("example10.route_api.http_method_GET.subject_id"); total != 1 {
				t.Fatalf("example 10: value_to_metric counted %d", total)
			}

			// 11: share_threshold: every files/* value shares one window.
			for i := 0; i < 5; i++ {
				s.call("example11", d("files=files/a.pdf"))
				s.call("example11", d("files=files/b.csv"))
			}
			expect(t, "example 11 shared", s.call("example11", d("files=files/c.txt")).Statuses[0], over, 10, 0)
			for i := 0; i < 10; i++ {
				s.call("example11", d("files_no_share=files_no_share/a.pdf"))
			}
			expect(t, "example 11 isolated", s.call("example11", d("files_no_share=files_no_share/b.csv")).Statuses[0], ok, 10, 9)
		})
	}
}

// 100 concurrent calls on one descriptor at limit 10: exactly 10 OK.
func TestConcurrentCallsAdmitExactlyTheLimit(t *testing.T) {
	for name, redisServer := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := start(t, redisServer.Addr(), map[string]string{"c.yaml": `
domain: login
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`}, nil)
			var wg sync.WaitGroup
			var mu sync.Mutex
			okCount, errs := 0, 0
			for i := 0; i < 100; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := s.try(&pb.RateLimitRequest{Domain: "login", Descriptors: []*rlsCommonDescriptor{d("user=alice")}})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs++
					} else if resp.OverallCode == pb.RateLimitResponse_OK {
						okCount++
					}
				}()
			}
			wg.Wait()
			if okCount != 10 || errs != 0 {
				t.Fatalf("100 concurrent calls at limit 10: %d OK, %d errors", okCount, errs)
			}
			total, over, _, within, _ := s.srv.Service.Metrics().Snapshot("login.user")
			if total != 100 || over != 90 || within != 10 {
				t.Fatalf("counters: total %d over %d within %d", total, over, within)
			}
		})
	}
}

// hits_addend: the request's cost; a descriptor's own hits_addend of 0
// checks without recording.
func TestHitsAddendAndOverride(t *testing.T) {
	for name, redisServer := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := start(t, redisServer.Addr(), map[string]string{"h.yaml": `
domain: api
descriptors:
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: blocked
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`}, nil)
			ok, over := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT
			// A limit of 0 in shadow mode: answered OK, counted as shadow.
			if r := s.call("api", d("blocked=x")); r.OverallCode != ok || r.Statuses[0].Code != ok {
				t.Fatalf("a zero limit in shadow mode: %v", r)
			}
			if _, _, _, _, shadow := s.srv.Service.Metrics().Snapshot("api.blocked"); shadow != 1 {
				t.Fatalf("a zero limit in shadow mode counted %d shadow hits", shadow)
			}
			r, err := s.try(&pb.RateLimitRequest{Domain: "api", Descriptors: []*rlsCommonDescriptor{d("key=k")}, HitsAddend: 3})
			if err != nil {
				t.Fatal(err)
			}
			expect(t, "hits_addend 3", r.Statuses[0], ok, 10, 7)
			expect(t, "descriptor hits_addend 7", s.call("api", hits(d("key=k"), 7)).Statuses[0], ok, 10, 0)
			expect(t, "check only", s.call("api", hits(d("key=k"), 0)).Statuses[0], ok, 10, 0)
			r = s.call("api", d("key=k"))
			expect(t, "full", r.Statuses[0], over, 10, 0)
			if r.Statuses[0].DurationUntilReset.AsDuration() <= 0 {
				t.Fatalf("a rejection's duration_until_reset is %v", r.Statuses[0].DurationUntilReset.AsDuration())
			}

			// The request's own limit wins over the configuration.
			override := d("key=o")
			override.Limit = &rlsCommonOverride{RequestsPerUnit: 2, Unit: rlsCommonUnitMinute}
			expect(t, "override 1", s.call("api", override).Statuses[0], ok, 2, 1)
			expect(t, "override 2", s.call("api", override).Statuses[0], ok, 2, 0)
			expect(t, "override 3", s.call("api", override).Statuses[0], over, 2, 0)

			// unit_multiplier: a window of 90 seconds.
			long := d("key=m")
			long.Limit = &rlsCommonOverride{RequestsPerUnit: 1, Unit: rlsCommonUnitSecond, UnitMultiplier: wrapperspb.UInt32(90)}
			s.call("api", long)
			r = s.call("api", long)
			if wait := r.Statuses[0].DurationUntilReset.AsDuration(); r.Statuses[0].Code != over || wait <= 60*time.Second || wait > 90*time.Second {
				t.Fatalf("unit_multiplier 90 of SECOND: %v, retry after %v", r.Statuses[0].Code, wait)
			}

			// A bad request is refused as such, never answered as an outage.
			big := d("key=k")
			big.Limit = &rlsCommonOverride{RequestsPerUnit: 2_000_000, Unit: rlsCommonUnitMinute}
			if _, err := s.try(&pb.RateLimitRequest{Domain: "api", Descriptors: []*rlsCommonDescriptor{big}}); err == nil ||
				!contains(err.Error(), "requests_per_unit must be from 0 to 1000000") {
				t.Fatalf("an override above the cap: %v", err)
			}
			if _, err := s.try(&pb.RateLimitRequest{Domain: "", Descriptors: []*rlsCommonDescriptor{d("key=k")}}); err == nil {
				t.Fatal("an empty domain was accepted")
			}
		})
	}
}

func contains(s, sub string) bool { return stringsContains(s, sub) }
