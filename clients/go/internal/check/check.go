// Package check refuses the configuration of a limit when it is built (the
// nethttp middleware, the ulule limiter), with the argument's name and its
// range: never at the first request, never through the error policy.
package check

import (
	"fmt"
	"strconv"
	"time"

	xcloak "github.com/xcloak/xcloak/clients/go"
)

const (
	// MaxLimit is the largest limit of the Lua fallback and of the module's
	// default xcloak.max-limit.
	MaxLimit = 1_000_000
	// MaxCost is the largest COST the server takes.
	MaxCost = 1_000_000
	// MaxTiers is the most tiers a call takes: the positional pair and 15 TIERs.
	MaxTiers = 16
)

// Limit checks one limit: window and limit, its tiers, and its cost (0
// means 1). where names it in the message ("xcloak/nethttp: Limits[0]").
func Limit(where string, window time.Duration, limit int, tiers []xcloak.Tier, cost int) error {
	if err := Window(where+".Window", window); err != nil {
		return err
	}
	if limit < 1 || limit > MaxLimit {
		return refuse("%s.Limit must be an integer from 1 to %d, not %d", where, MaxLimit, limit)
	}
	if len(tiers)+1 > MaxTiers {
		return refuse("%s.Tiers must hold at most %d tiers (%d in all with the positional one), not %d", where, MaxTiers-1, MaxTiers, len(tiers))
	}
	smallest := limit
	for i, t := range tiers {
		name := where + ".Tiers[" + strconv.Itoa(i) + "]"
		if err := Window(name+".Window", t.Window); err != nil {
			return err
		}
		if t.Limit < 1 || t.Limit > MaxLimit {
			return refuse("%s.Limit must be an integer from 1 to %d, not %d", name, MaxLimit, t.Limit)
		}
		smallest = min(smallest, t.Limit)
	}
	if cost < 0 || cost > MaxCost {
		return refuse("%s.Cost must be an integer from 1 to %d (0: 1), not %d", where, MaxCost, cost)
	}
	if cost > smallest {
		return refuse("%s.Cost must be at most the smallest limit of its tiers (%d), not %d: no request could ever be admitted", where, smallest, cost)
	}
	return nil
}

// Window checks a window: a whole number of milliseconds, from 1 ms (the
// server's 2^53-1 ms is beyond a Duration's 292 years).
func Window(name string, window time.Duration) error {
	if window < time.Millisecond || window%time.Millisecond != 0 {
		return refuse("%s must be a whole number of milliseconds from 1ms (a time.Duration), not %v", name, window)
	}
	return nil
}

func refuse(format string, args ...interface{}) error {
	return &xcloak.Error{Message: fmt.Sprintf(format, args...)}
}
