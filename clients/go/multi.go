package xcloak

import (
	"context"
	"errors"
	"time"
)

// MultiResult is the decision of AllowAll.
type MultiResult struct {
	// Allowed: every request was admitted.
	Allowed bool
	// Results has one Result per request sent, in order; a refunded
	// request's Result still shows its own admission.
	Results []Result
	// Rejected is the index of the request that was rejected, or -1.
	Rejected int
	// Binding is the index of the Result that speaks for the call: the
	// rejected one, or when all were admitted the one with the fewest
	// Remaining (ties: the earliest).
	Binding int
}

// RetryAfter is the binding Result's RetryAfter.
func (m MultiResult) RetryAfter() time.Duration {
	if m.Binding < 0 || m.Binding >= len(m.Results) {
		return 0
	}
	return m.Results[m.Binding].RetryAfter
}

// AllowAll admits one request against several identities on different keys
// (different cluster slots), all or nothing: an account and an address, say.
// The requests are admitted in order, each with a stamp. If request j is
// rejected, requests 0..j-1 are refunded by their stamps and costs, in
// order, and the requests after j are not sent. It never over-admits:
// between an admission and its refund the earlier key holds one admission
// more than it will, for one round trip (conservative). An outage at request
// j refunds 0..j-1 (best effort), then applies the error policy once for the
// whole call: PolicyRaise returns the *UnavailableError; PolicyAllow and
// PolicyDeny return the Results received before the outage followed by the
// policy's Result for request j (its tier 0, Via ViaError), which is the
// Binding one, with Allowed by the policy and Rejected j under PolicyDeny
// (-1 under PolicyAllow). Options: WithNow.
func (l *Limiter) AllowAll(ctx context.Context, requests []Request, opts ...CallOption) (MultiResult, error) {
	m := MultiResult{Rejected: -1, Results: make([]Result, 0, len(requests))}
	undo := func() {
		for i, r := range m.Results {
			req := requests[i]
			l.refundBestEffort(ctx, l.opt.Prefix+req.Key, r.Stamp, req.Cost, req.Cost != 0)
		}
	}
	for j, req := range requests {
		call := l.newCall(req.Key, req.Window, req.Limit, opts)
		call.stamp = true
		WithTiers(req.Tiers...)(call)
		if req.Cost != 0 {
			call.cost, call.hasCost = req.Cost, true
		}
		r, err := l.allow(ctx, call, false)
		if err != nil {
			// An outage at j (request j's own admission, if it was one that was
			// not replicated, is refunded by allow under PolicyDeny).
			undo()
			var unavailable *UnavailableError
			if !errors.As(err, &unavailable) {
				return MultiResult{}, err
			}
			res, err := l.policy(ctx, err, req.Limit, call.windowMs)
			if err != nil {
				return MultiResult{}, err
			}
			// The Results received, then the policy's for request j (its tier
			// 0), which binds; under PolicyDeny, j is the rejected one.
			m.Results = append(m.Results, res)
			m.Allowed, m.Binding = res.Allowed, j
			if !res.Allowed {
				m.Rejected = j
			}
			return m, nil
		}
		m.Results = append(m.Results, r)
		if !r.Allowed {
			m.Results = m.Results[:j]
			undo()
			m.Results = append(m.Results, r)
			m.Rejected, m.Binding = j, j
			return m, nil
		}
	}
	m.Allowed = true
	for i, r := range m.Results {
		if r.Remaining < m.Results[m.Binding].Remaining {
			m.Binding = i
		}
	}
	return m, nil
}
