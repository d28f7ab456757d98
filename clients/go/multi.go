package xcloak

import (
	"context"
	"errors"
)

// MultiDecision is the decision of AllowAll.
type MultiDecision struct {
	// Allowed: every request was admitted.
	Allowed bool
	// Decisions has one Decision per request sent, in order; a refunded
	// request's Decision still shows its own admission.
	Decisions []Decision
	// Rejected is the index of the request that was rejected, or -1.
	Rejected int
	// Binding is the Decision that speaks for the call (its RetryAfter is
	// the call's): the rejected one, or when all were admitted the one with
	// the fewest Remaining (ties: the earliest).
	Binding Decision
	// BindingIndex is Binding's index in Decisions.
	BindingIndex int
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
// PolicyDeny return the Decisions received before the outage followed by the
// policy's Decision for request j (its tier 0, Via ViaError), which is the
// Binding one, with Allowed by the policy and Rejected j under PolicyDeny
// (-1 under PolicyAllow). Options: WithNow.
func (l *Limiter) AllowAll(ctx context.Context, requests []Request, opts ...CallOption) (MultiDecision, error) {
	m := MultiDecision{Rejected: -1, Decisions: make([]Decision, 0, len(requests))}
	undo := func() {
		for i, r := range m.Decisions {
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
				return MultiDecision{}, err
			}
			res, err := l.policy(ctx, err, req.Limit, call.windowMs)
			if err != nil {
				return MultiDecision{}, err
			}
			// The Decisions received, then the policy's for request j (its tier
			// 0), which binds; under PolicyDeny, j is the rejected one.
			m.Decisions = append(m.Decisions, res)
			m.Allowed, m.Binding, m.BindingIndex = res.Allowed, res, j
			if !res.Allowed {
				m.Rejected = j
			}
			return m, nil
		}
		m.Decisions = append(m.Decisions, r)
		if !r.Allowed {
			m.Decisions = m.Decisions[:j]
			undo()
			m.Decisions = append(m.Decisions, r)
			m.Rejected, m.Binding, m.BindingIndex = j, r, j
			return m, nil
		}
	}
	m.Allowed = true
	for i, r := range m.Decisions {
		if r.Remaining < m.Decisions[m.BindingIndex].Remaining {
			m.BindingIndex = i
		}
	}
	if len(m.Decisions) > 0 {
		m.Binding = m.Decisions[m.BindingIndex]
	}
	return m, nil
}
