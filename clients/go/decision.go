package xcloak

import (
	"fmt"
	"math"
	"time"
)

// Via says who decided a Decision.
type Via string

const (
	ViaCommand Via = "command" // the module (XCLOAK.ALLOW, XCLOAK.PEEK)
	ViaScript  Via = "script"  // the bundled Lua script, on a server without the module
	ViaError   Via = "error"   // the error policy: the server did not answer (Decision.Err says why)
	ViaCache   Via = "cache"   // the block cache: a rejection answered without a call (Options.BlockCache)
)

// Decision is one decision: the contract's Decision (docs/clients.md), read
// from the reply of XCLOAK.ALLOW ... DETAILS [STAMP] or XCLOAK.PEEK. Its
// first fields have go-redis/redis_rate's names, not all their meanings:
// clients/go/README.md, "From go-redis/redis_rate", maps them field by field.
type Decision struct {
	// Allowed: admitted (Peek: would be admitted now).
	Allowed bool
	// Limit is the binding tier's limit.
	Limit int
	// Remaining is the binding tier's remaining units, never below 0.
	Remaining int
	// RetryAfter is 0 when allowed; else the wait until the request fits in
	// every tier if nothing else is admitted meanwhile. It is -1 when the
	// request can never fit: see CostExceedsLimit. (redis_rate's -1 means
	// admitted; here an admission is 0.)
	RetryAfter time.Duration
	// ResetAfter is the time until the binding tier's window is empty.
	ResetAfter time.Duration
	// CostExceedsLimit: the cost is above a tier's limit, so the request can
	// never be admitted. Answer with a client error; don't retry.
	CostExceedsLimit bool
	// Window is the binding tier's window.
	Window time.Duration
	// Tier is the binding tier's index: 0 for the positional window and limit,
	// i for the i-th WithTiers entry.
	Tier int
	// Tiers has one entry per tier, in the order given, when the call had
	// tiers; else it is empty.
	Tiers []TierState
	// Stamp is the admission's stamp (the handle Refund takes) when the call
	// asked for one (WithStamp, AllowAll, skip-successful middleware); -1
	// when rejected or not asked.
	Stamp int64
	// Oldest is, for a Peek WithOldest, the stamp (unix ms) of the oldest
	// entry live in the binding tier's window: where a moving window starts.
	// -1 when that window is empty or not asked (HasOldest).
	Oldest int64
	// Via says who decided.
	Via Via
	// Err is the outage or timeout the error policy answered (Via == ViaError).
	Err error

	// The reply's milliseconds, exact where a Duration saturates (windows up
	// to 2^53-1 ms are longer than Duration's 292 years): the headers use them.
	exact    bool
	windowMs int64
	retryMs  int64
	resetMs  int64
}

// TierState is one tier's state in a Decision.
type TierState struct {
	Window     time.Duration
	Limit      int
	Remaining  int
	RetryAfter time.Duration // 0 if this tier has room, -1 if the cost exceeds its limit
	ResetAfter time.Duration

	exact                      bool
	windowMs, retryMs, resetMs int64
}

// HasStamp reports whether the Decision carries an admission's stamp.
func (r Decision) HasStamp() bool { return r.Stamp >= 0 }

// HasOldest reports whether the Decision carries the oldest live entry's stamp.
func (r Decision) HasOldest() bool { return r.Oldest >= 0 }

// maxDurationMs is the largest whole number of milliseconds a Duration holds.
const maxDurationMs = math.MaxInt64 / int64(time.Millisecond)

// duration maps the reply's milliseconds onto a Duration: -1 stays -1 (never
// fits), and a value beyond Duration's range saturates at its maximum
// (docs/clients.md, Decision).
func duration(ms int64) time.Duration {
	switch {
	case ms < 0:
		return -1
	case ms > maxDurationMs:
		return math.MaxInt64
	default:
		return time.Duration(ms) * time.Millisecond
	}
}

// milliseconds is the whole number of milliseconds of d, for a hand-built
// Decision (rounded up: a header must never send a client back early).
func milliseconds(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

func (r Decision) msWindow() int64 {
	if r.exact {
		return r.windowMs
	}
	return milliseconds(r.Window)
}

func (r Decision) msRetry() int64 {
	if r.exact {
		return r.retryMs
	}
	return milliseconds(r.RetryAfter)
}

func (r Decision) msReset() int64 {
	if r.exact {
		return r.resetMs
	}
	return milliseconds(r.ResetAfter)
}

func (t TierState) msWindow() int64 {
	if t.exact {
		return t.windowMs
	}
	return milliseconds(t.Window)
}

func (t TierState) msRetry() int64 {
	if t.exact {
		return t.retryMs
	}
	return milliseconds(t.RetryAfter)
}

func (t TierState) msReset() int64 {
	if t.exact {
		return t.resetMs
	}
	return milliseconds(t.ResetAfter)
}

// parseDecision reads a reply of XCLOAK.ALLOW ... DETAILS [STAMP] or
// XCLOAK.PEEK ... [OLDEST] (or of their scripts): [allowed, limit,
// remaining, retry_after_ms, reset_after_ms], then with tiers one [window,
// limit, remaining, retry_after_ms, reset_after_ms] per tier, then with STAMP
// the stamp (-1 on a rejection), with OLDEST the oldest live entry of the
// binding tier's window (-1 when empty). windowMs is the positional window
// asked.
func parseDecision(reply interface{}, windowMs int64, withTiers, withStamp, withOldest bool) (Decision, error) {
	fields, ok := reply.([]interface{})
	want := 5
	if withTiers {
		want++
	}
	if withStamp || withOldest {
		want++
	}
	if !ok || len(fields) != want {
		return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (want %d fields)", reply, want)}
	}
	var head [5]int64
	for i := range head {
		n, ok := fields[i].(int64)
		if !ok {
			return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (field %d is not an integer)", reply, i)}
		}
		head[i] = n
	}
	r := Decision{
		Allowed:          head[0] == 1,
		Limit:            int(head[1]),
		Remaining:        int(head[2]),
		RetryAfter:       duration(head[3]),
		ResetAfter:       duration(head[4]),
		CostExceedsLimit: head[3] < 0,
		Window:           duration(windowMs),
		Stamp:            -1,
		Oldest:           -1,
		exact:            true,
		windowMs:         windowMs,
		retryMs:          head[3],
		resetMs:          head[4],
	}
	if withTiers {
		tiers, ok := fields[5].([]interface{})
		if !ok || len(tiers) == 0 {
			return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (no tiers)", reply)}
		}
		r.Tiers = make([]TierState, len(tiers))
		r.Tier = -1
		for i, t := range tiers {
			tier, ok := t.([]interface{})
			if !ok || len(tier) != 5 {
				return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected tier %v in reply", t)}
			}
			var v [5]int64
			for j := range v {
				if v[j], ok = tier[j].(int64); !ok {
					return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected tier %v in reply", t)}
				}
			}
			r.Tiers[i] = TierState{
				Window: duration(v[0]), Limit: int(v[1]), Remaining: int(v[2]),
				RetryAfter: duration(v[3]), ResetAfter: duration(v[4]),
				exact: true, windowMs: v[0], retryMs: v[3], resetMs: v[4],
			}
			// The binding tier is the first whose fields are the reply's: the
			// server breaks ties to the earliest tier (docs/clients.md).
			if r.Tier < 0 && v[1] == head[1] && v[2] == head[2] && v[3] == head[3] && v[4] == head[4] {
				r.Tier = i
			}
		}
		if r.Tier < 0 {
			return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (no tier matches the binding fields)", reply)}
		}
		r.windowMs = r.Tiers[r.Tier].windowMs
		r.Window = r.Tiers[r.Tier].Window
	}
	if withStamp {
		stamp, ok := fields[want-1].(int64)
		if !ok {
			return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (the stamp is not an integer)", reply)}
		}
		r.Stamp = stamp // -1 on a rejection
	}
	if withOldest {
		oldest, ok := fields[want-1].(int64)
		if !ok {
			return Decision{}, &Error{Message: fmt.Sprintf("xcloak: unexpected reply %v (the oldest entry is not an integer)", reply)}
		}
		r.Oldest = oldest // -1 when the binding tier's window is empty
	}
	return r, nil
}

// policyDecision is the Decision of the error policy: allowed by the policy,
// tier 0's limit and window as asked, nothing else (docs/clients.md).
func policyDecision(allowed bool, limit int, windowMs int64, cause error) Decision {
	return Decision{
		Allowed: allowed, Limit: limit, Window: duration(windowMs), Stamp: -1, Oldest: -1,
		Via: ViaError, Err: cause, exact: true, windowMs: windowMs,
	}
}
