// Package ratelimit is xcloak-ratelimit: a rate limit service for Envoy
// (envoy.service.ratelimit.v3.RateLimitService) that reads
// envoyproxy/ratelimit's configuration files unchanged and decides each
// matched limit with an exact sliding window (XCLOAK.ALLOW, or the bundled
// Lua script where the server has no module), all descriptors of a request
// all or nothing.
//
// The pieces, each in its own file: config/ reads and matches the
// configuration; service.go answers ShouldRateLimit on an xcloak.Limiter;
// metrics.go counts; server.go serves gRPC and HTTP and reloads the
// configuration; settings.go reads the reference's environment variables;
// cmd/xcloak-ratelimit is the binary.
package ratelimit

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	xcloak "github.com/xcloak/xcloak/clients/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xcloak/xcloak/clients/go/ratelimit/config"
)

// maxCost is the largest COST the module and the script take.
const maxCost = 1_000_000

// maxWindow is the longest window a Go Duration holds (the module takes up
// to 2^53-1 ms; a Duration stops at about 292 years).
const maxWindow = time.Duration(1<<63 - 1)

// HeaderOptions say which response headers the service adds
// (LIMIT_RESPONSE_HEADERS_ENABLED and its names).
type HeaderOptions struct {
	Enabled bool
	// Style: xcloak.StyleLegacy (the reference's three fields, renamed by
	// the names below), StyleIETF or StyleBoth.
	Style xcloak.Style
	// The legacy fields' names (default RateLimit-Limit, -Remaining, -Reset).
	LimitName, RemainingName, ResetName string
}

// ServiceOptions configure a Service.
type ServiceOptions struct {
	// NearLimitRatio: a limit is near once this share of it is used (0.8).
	NearLimitRatio float64
	// GlobalShadowMode answers OK to every request (SHADOW_MODE).
	GlobalShadowMode bool
	// Headers adds rate limit headers to the response.
	Headers HeaderOptions
	// MaxLimit bounds a request's own limit override (default 1,000,000).
	MaxLimit uint32
}

// Service answers ShouldRateLimit. It is safe for concurrent use; the
// configuration is swapped atomically, so a reload loses no request.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	limiter *xcloak.Limiter
	config  atomic.Pointer[config.Config]
	metrics *Metrics
	opt     ServiceOptions
}

// NewService returns a Service deciding with limiter (whose Prefix is the
// keys' prefix, CACHE_KEY_PREFIX).
func NewService(limiter *xcloak.Limiter, metrics *Metrics, opt ServiceOptions) *Service {
	if opt.NearLimitRatio == 0 {
		opt.NearLimitRatio = 0.8
	}
	if opt.MaxLimit == 0 {
		opt.MaxLimit = config.DefaultMaxLimit
	}
	if opt.Headers.Style == "" {
		opt.Headers.Style = xcloak.StyleLegacy
	}
	if opt.Headers.LimitName == "" {
		opt.Headers.LimitName = "RateLimit-Limit"
	}
	if opt.Headers.RemainingName == "" {
		opt.Headers.RemainingName = "RateLimit-Remaining"
	}
	if opt.Headers.ResetName == "" {
		opt.Headers.ResetName = "RateLimit-Reset"
	}
	return &Service{limiter: limiter, metrics: metrics, opt: opt}
}

// SetConfig makes c the configuration of every request from now on.
func (s *Service) SetConfig(c *config.Config) { s.config.Store(c) }

// Config is the configuration in use (nil before the first load).
func (s *Service) Config() *config.Config { return s.config.Load() }

// Metrics are the service's counters.
func (s *Service) Metrics() *Metrics { return s.metrics }

// how a descriptor is decided
type kind int

const (
	kindNone      kind = iota // no limit applies: OK, nothing sent
	kindUnlimited             // unlimited: OK, nothing sent
	kindEnforced              // decided with the others, all or nothing
	kindShadow                // shadow_mode: recorded, answered OK
	kindCheck                 // hits_addend 0: checked, nothing recorded
	kindZero                  // requests_per_unit 0: always over, nothing sent
)

type item struct {
	kind  kind
	limit *config.Limit
	key   string
	hits  uint64
	// the decision read for it, and whether it was a PEEK (nothing recorded)
	res      xcloak.Decision
	has      bool
	refunded bool
	over     bool
}

// ShouldRateLimit decides a request: every descriptor with a limit is one
// exact sliding window (window = the unit, limit = requests_per_unit, cost =
// hits_addend), and the descriptors that are enforced are decided all or
// nothing: when one is over its limit, none is consumed.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	s.metrics.Calls.Add(1)
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	cfg := s.config.Load()
	if cfg == nil {
		s.metrics.ServiceError.Add(1)
		return nil, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	items, err := s.match(cfg, req)
	if err != nil {
		return nil, err
	}

	// The enforced descriptors, all or nothing. A zero limit among them
	// rejects the request without a call: nothing may then be consumed.
	var enforced []int
	zeroEnforced := false
	for i := range items {
		switch items[i].kind {
		case kindEnforced:
			enforced = append(enforced, i)
		case kindZero:
			items[i].over = true
			if !items[i].limit.ShadowMode {
				zeroEnforced = true
			}
		}
	}
	var peeks []int
	if len(enforced) > 0 && !zeroEnforced {
		requests := make([]xcloak.Request, len(enforced))
		for j, i := range enforced {
			it := &items[i]
			requests[j] = xcloak.Request{Key: it.key, Window: it.limit.Window(), Limit: int(it.limit.RequestsPerUnit), Cost: int(it.hits)}
		}
		m, err := s.limiter.AllowAll(ctx, requests)
		if err != nil {
			return nil, s.failure(err)
		}
		for j, i := range enforced {
			it := &items[i]
			if j >= len(m.Decisions) {
				peeks = append(peeks, i) // not sent: after the rejected one
				continue
			}
			it.res, it.has = m.Decisions[j], true
			switch {
			case m.Rejected == j, it.res.Via == xcloak.ViaError && !it.res.Allowed:
				it.over = true
			case m.Rejected >= 0 && j < m.Rejected:
				it.refunded = true
			}
		}
	} else {
		peeks = append(peeks, enforced...)
	}
	for i := range items {
		if items[i].kind == kindCheck {
			peeks = append(peeks, i)
		}
	}
	for _, i := range peeks {
		it := &items[i]
		res, err := s.limiter.Peek(ctx, it.key, it.limit.Window(), int(it.limit.RequestsPerUnit), xcloak.WithCost(int(max(it.hits, 1))))
		if err != nil {
			return nil, s.failure(err)
		}
		it.res, it.has = res, true
		// A check (hits_addend 0) adds nothing, so it is never over, as in
		// the reference; an enforced descriptor that was not sent reports
		// whether it would have fitted, and consumed nothing.
		it.over = it.kind != kindCheck && !res.Allowed
	}
	for i := range items {
		it := &items[i]
		if it.kind != kindShadow {
			continue
		}
		res, err := s.limiter.Allow(ctx, it.key, it.limit.Window(), int(it.limit.RequestsPerUnit), xcloak.WithCost(int(it.hits)))
		if err != nil {
			return nil, s.failure(err)
		}
		it.res, it.has, it.over = res, true, !res.Allowed
	}
	return s.respond(items), nil
}

// match finds each descriptor's limit and applies replaces and unlimited.
func (s *Service) match(cfg *config.Config, req *pb.RateLimitRequest) ([]item, error) {
	items := make([]item, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		entries := make([]config.Entry, len(d.GetEntries()))
		for k, e := range d.GetEntries() {
			entries[k] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		it := &items[i]
		it.hits = uint64(max(1, req.GetHitsAddend()))
		if d.GetHitsAddend() != nil {
			it.hits = d.GetHitsAddend().GetValue()
		}
		if it.hits > maxCost {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: hits_addend must be from 0 to %d (got %d)", i, maxCost, it.hits)
		}
		if o := d.GetLimit(); o != nil && cfg.HasDomain(req.Domain) {
			unit := pb.RateLimitResponse_RateLimit_Unit(o.GetUnit())
			if config.UnitWindow(unit) == 0 {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: the limit override's unit must be SECOND to YEAR (got %v)", i, o.GetUnit())
			}
			if o.GetRequestsPerUnit() > s.opt.MaxLimit {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: the limit override's requests_per_unit must be from 0 to %d (got %d)",
					i, s.opt.MaxLimit, o.GetRequestsPerUnit())
			}
			multiplier := uint32(1)
			if m := o.GetUnitMultiplier(); m != nil {
				multiplier = m.GetValue()
				if multiplier == 0 || time.Duration(multiplier) > maxWindow/config.UnitWindow(unit) {
					return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: the limit override's unit_multiplier must be from 1 to %d for unit %v (got %d)",
						i, maxWindow/config.UnitWindow(unit), o.GetUnit(), multiplier)
				}
			}
			it.limit = &config.Limit{StatsKey: config.StatsKey(req.Domain, entries), RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unit, Multiplier: multiplier}
			it.key = config.OverrideKey(req.Domain, entries, it.limit.Window())
		} else if m := cfg.Find(req.Domain, entries); m != nil {
			it.limit, it.key = m.Limit, m.Key
		}
		if it.limit == nil {
			continue
		}
		for _, r := range it.limit.Replaces {
			replacing[r] = true
		}
		if it.limit.Unlimited {
			it.kind = kindUnlimited
		}
	}
	for i := range items {
		it := &items[i]
		switch {
		case it.limit == nil:
			it.kind = kindNone
		case it.kind == kindUnlimited:
		case it.limit.Name != "" && replacing[it.limit.Name]:
			it.kind, it.limit = kindNone, nil
		case it.hits == 0:
			it.kind = kindCheck
		case it.limit.RequestsPerUnit == 0:
			it.kind = kindZero
		case it.limit.ShadowMode:
			it.kind = kindShadow
		default:
			it.kind = kindEnforced
		}
	}
	return items, nil
}

// failure maps a limiter error to the gRPC error Envoy's failure_mode_deny
// decides on: an outage or timeout is Unavailable; anything else (an
// argument the server refused) is a bug in the configuration, reported as
// such and never as an outage.
func (s *Service) failure(err error) error {
	var unavailable *xcloak.UnavailableError
	if errors.As(err, &unavailable) {
		s.metrics.RedisError.Add(1)
		return status.Error(codes.Unavailable, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		s.metrics.RedisError.Add(1)
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	s.metrics.ServiceError.Add(1)
	return status.Error(codes.Internal, err.Error())
}

func durationOf(d time.Duration) *durationpb.Duration {
	if d < 0 {
		d = 0
	}
	return durationpb.New(d)
}

func (s *Service) respond(items []item) *pb.RateLimitResponse {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(items))}
	var decided []xcloak.Decision
	binding, bindingOver := -1, false
	for i := range items {
		it := &items[i]
		st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch it.kind {
		case kindNone:
			continue
		case kindUnlimited:
			st.LimitRemaining = math.MaxUint32
			s.metrics.Unlimited.Add(1)
			s.metrics.Limit(it.limit.StatsKey).TotalHits.Add(it.hits)
			continue
		}
		limit := uint64(it.limit.RequestsPerUnit)
		st.CurrentLimit = it.limit.Proto()
		remaining := uint64(0)
		if it.has && it.res.Via != xcloak.ViaError {
			remaining = uint64(max(it.res.Remaining, 0))
		}
		// Units used before this request, for the near/over counters.
		before := limit - min(remaining, limit)
		switch {
		case it.over:
			st.Code = pb.RateLimitResponse_OVER_LIMIT
			wait := it.limit.Window()
			if it.has && it.res.RetryAfter > 0 {
				wait = it.res.RetryAfter
			}
			st.DurationUntilReset = durationOf(wait)
		case it.has:
			if it.kind != kindCheck && it.res.Allowed && it.res.Via != xcloak.ViaError {
				// Admitted: the reply's remaining is after this request's units.
				before = limit - min(remaining+it.hits, limit)
			}
			if it.refunded {
				remaining = min(limit, remaining+it.hits)
			}
			st.DurationUntilReset = durationOf(it.res.ResetAfter)
		}
		st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		shadow := it.limit.ShadowMode
		if it.kind != kindCheck {
			s.metrics.Limit(it.limit.StatsKey).record(it.hits, before, limit, it.over, shadow, s.opt.NearLimitRatio)
		}
		if it.over && !shadow {
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
		if shadow {
			st.Code = pb.RateLimitResponse_OK
		}
		if it.has {
			decided = append(decided, it.res)
			enforcedOver := it.over && !shadow
			if binding < 0 || (enforcedOver && !bindingOver) ||
				(enforcedOver == bindingOver && it.res.Remaining < decided[binding].Remaining) {
				binding, bindingOver = len(decided)-1, enforcedOver
			}
		}
	}
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT && s.opt.GlobalShadowMode {
		resp.OverallCode = pb.RateLimitResponse_OK
		s.metrics.GlobalShadowMode.Add(1)
	}
	if s.opt.Headers.Enabled && binding >= 0 {
		resp.ResponseHeadersToAdd = s.headers(decided, binding, resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT)
	}
	return resp
}

// headers are the contract's rate limit fields of the decisions (the
// binding one: the rejected, else the one with the fewest remaining), with
// the legacy fields renamed as configured. Retry-After goes with a rejection
// only: a descriptor over its limit in shadow mode (or under SHADOW_MODE) is
// answered OK, and Envoy adds these headers to a response it lets through.
func (s *Service) headers(decided []xcloak.Decision, binding int, rejected bool) []*core.HeaderValue {
	h := xcloak.MultiDecision{Decisions: decided, Binding: decided[binding], BindingIndex: binding, Rejected: -1}.Headers(s.opt.Headers.Style)
	rename := map[string]string{
		"Ratelimit-Limit":     s.opt.Headers.LimitName,
		"Ratelimit-Remaining": s.opt.Headers.RemainingName,
		"Ratelimit-Reset":     s.opt.Headers.ResetName,
	}
	order := []string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit", "Retry-After"}
	var out []*core.HeaderValue
	for _, k := range order {
		if k == "Retry-After" && !rejected {
			continue
		}
		for _, v := range h.Values(k) {
			name := k
			if r, ok := rename[k]; ok {
				name = r
			} else {
				name = canonical(k)
			}
			out = append(out, &core.HeaderValue{Key: name, Value: v})
		}
	}
	return out
}

// canonical spells the contract's header names as docs/clients.md does.
func canonical(k string) string {
	switch k {
	case "Ratelimit-Policy":
		return "RateLimit-Policy"
	case "Ratelimit":
		return "RateLimit"
	}
	return k
}
