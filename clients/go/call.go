package xcloak

import (
	"strconv"
	"time"
)

// Tier is one more window on the same key, checked in the same call
// (`TIER window limit`): all tiers admit, or none records.
type Tier struct {
	Window time.Duration
	Limit  int
}

// Request is one identity's limit in AllowAll: the arguments of one Allow.
type Request struct {
	Key    string
	Window time.Duration
	Limit  int
	Tiers  []Tier
	Cost   int // 0 means 1
}

// CallOption adds an optional argument to a call.
type CallOption func(*call)

// WithCost makes the request cost n units (COST n; the default is 1).
func WithCost(n int) CallOption { return func(c *call) { c.cost, c.hasCost = n, true } }

// WithTiers adds tiers after the positional window and limit: tier i of the
// Decision is the i-th one given here.
func WithTiers(tiers ...Tier) CallOption {
	return func(c *call) {
		for _, t := range tiers {
			ms, err := wholeMs(t.Window, "window of TIER "+strconv.Itoa(len(c.tiers)+1))
			if err != nil && c.err == nil {
				c.err = err
			}
			c.tiers = append(c.tiers, tierArg{windowMs: ms, limit: t.Limit})
		}
	}
}

// WithStamp asks for the admission's stamp (Decision.Stamp), the handle
// Refund takes.
func WithStamp() CallOption { return func(c *call) { c.stamp = true } }

// WithOldest asks a Peek for the oldest entry live in the binding tier's
// window (OLDEST; Decision.Oldest): where a moving window starts.
func WithOldest() CallOption { return func(c *call) { c.oldest = true } }

// WithNow sends NOW ms (unix milliseconds): the decision is taken at that
// instant instead of the server's clock. For replays and tests; production
// wants the server's clock. A Limiter with a Clock sends its time.
func WithNow(ms int64) CallOption { return func(c *call) { c.now, c.hasNow = ms, true } }

type tierArg struct {
	windowMs int64
	limit    int
}

// call is one XCLOAK call's arguments, in the canonical order of
// docs/clients.md: key window limit [TIER w l]... [COST c] [NOW t], then
// DETAILS [STAMP] (ALLOW) or [OLDEST] (PEEK).
// Windows are in milliseconds (the server's unit, up to 2^53-1, beyond
// Duration's range); err is a window that was not a whole number of them.
type call struct {
	key      string
	windowMs int64
	limit    int
	tiers    []tierArg
	cost     int
	hasCost  bool
	now      int64
	hasNow   bool
	stamp    bool
	oldest   bool
	err      error
}

// wholeMs is d in milliseconds, or an error naming the argument when d is
// not a whole number of them (the only range check the client makes).
func wholeMs(d time.Duration, name string) (int64, error) {
	if d%time.Millisecond != 0 {
		return 0, &Error{Message: "xcloak: " + name + " must be a whole number of milliseconds, not " + d.String()}
	}
	return int64(d / time.Millisecond), nil
}

// argsAfterKey is how many slots args keeps in front of the arguments after
// the key, for what precedes them: "XCLOAK.ALLOW key" (the last two), or
// "EVALSHA sha 1 key" (all four). One allocation for the whole command line.
const argsAfterKey = 4

// args are the arguments after the key, for the command and its script
// alike, behind argsAfterKey empty slots; details adds DETAILS [STAMP]
// (ALLOW), else OLDEST when asked (PEEK).
func (c *call) args(details bool) []interface{} {
	a := make([]interface{}, argsAfterKey, argsAfterKey+8+3*len(c.tiers))
	a = append(a, c.windowMs, int64(c.limit))
	for _, t := range c.tiers {
		a = append(a, "TIER", t.windowMs, int64(t.limit))
	}
	if c.hasCost && c.cost != 1 {
		a = append(a, "COST", int64(c.cost))
	}
	if c.hasNow {
		a = append(a, "NOW", c.now)
	}
	if details {
		a = append(a, "DETAILS")
		if c.stamp {
			a = append(a, "STAMP")
		}
	} else if c.oldest {
		a = append(a, "OLDEST")
	}
	return a
}
