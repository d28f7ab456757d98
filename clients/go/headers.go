package xcloak

import (
	"net/http"
	"strconv"
	"strings"
)

// Style picks the HTTP rate-limit header fields (docs/clients.md, Headers).
type Style string

const (
	// StyleIETF (the default, also the zero Style): RateLimit-Policy and
	// RateLimit of draft-ietf-httpapi-ratelimit-headers-09/10, one policy per tier.
	StyleIETF Style = "ietf"
	// StyleLegacy: the draft-06 fields RateLimit-Limit, RateLimit-Remaining
	// and RateLimit-Reset, of the binding tier.
	StyleLegacy Style = "legacy"
	// StyleBoth: both sets.
	StyleBoth Style = "both"
)

// Headers returns the HTTP header fields of r in the given style: with
// names, one policy name per tier (the default is "<limit>-in-<s>s", or
// "<limit>-in-<ms>ms" for a window that is not whole seconds). A rejection
// with a RetryAfter above 0 adds Retry-After; a Decision of the error policy
// has no headers. Seconds are rounded up.
func (r Decision) Headers(style Style, names ...string) http.Header {
	h := http.Header{}
	setHeaders(h, style, []Decision{r}, [][]string{names}, 0)
	return h
}

// Headers returns the header fields of an AllowAll: the policies of every
// decision sent, in request order (names: one list per request), and the
// legacy fields and Retry-After of the binding decision.
func (m MultiDecision) Headers(style Style, names ...[]string) http.Header {
	h := http.Header{}
	setHeaders(h, style, m.Decisions, names, m.BindingIndex)
	return h
}

// setHeaders writes the fields of decisions (binding: the index whose legacy
// fields and Retry-After are sent) into h.
func setHeaders(h http.Header, style Style, decisions []Decision, names [][]string, binding int) {
	if len(decisions) == 0 || binding < 0 || binding >= len(decisions) {
		return
	}
	b := decisions[binding]
	if b.Via == ViaError {
		return
	}
	if style != StyleLegacy {
		var policies, items []string
		for i, d := range decisions {
			var n []string
			if i < len(names) {
				n = names[i]
			}
			for j, p := range d.policies() {
				name := p.name()
				if j < len(n) && n[j] != "" {
					name = n[j]
				}
				policies = append(policies, `"`+name+`";q=`+strconv.Itoa(p.limit)+";w="+seconds(p.windowMs))
				items = append(items, `"`+name+`";r=`+strconv.Itoa(p.remaining)+";t="+seconds(p.resetMs))
			}
		}
		h.Set("RateLimit-Policy", strings.Join(policies, ", "))
		h.Set("RateLimit", strings.Join(items, ", "))
	}
	if style == StyleLegacy || style == StyleBoth {
		h.Set("RateLimit-Limit", strconv.Itoa(b.Limit))
		h.Set("RateLimit-Remaining", strconv.Itoa(b.Remaining))
		h.Set("RateLimit-Reset", seconds(b.msReset()))
	}
	if retry := b.msRetry(); !b.Allowed && retry > 0 {
		h.Set("Retry-After", seconds(retry))
	}
}

// policy is one tier as the headers show it.
type policy struct {
	limit, remaining  int
	windowMs, resetMs int64
}

// name is the default policy name: "5-in-60s", or "3-in-1500ms".
func (p policy) name() string {
	if p.windowMs%1000 == 0 {
		return strconv.Itoa(p.limit) + "-in-" + strconv.FormatInt(p.windowMs/1000, 10) + "s"
	}
	return strconv.Itoa(p.limit) + "-in-" + strconv.FormatInt(p.windowMs, 10) + "ms"
}

// policies is one policy per tier, or the binding one without tiers.
func (r Decision) policies() []policy {
	if len(r.Tiers) == 0 {
		return []policy{{r.Limit, r.Remaining, r.msWindow(), r.msReset()}}
	}
	out := make([]policy, len(r.Tiers))
	for i, t := range r.Tiers {
		out[i] = policy{t.Limit, t.Remaining, t.msWindow(), t.msReset()}
	}
	return out
}

// seconds rounds milliseconds up to whole seconds: rounding down would tell
// a client to come back before its request can fit.
func seconds(ms int64) string {
	if ms <= 0 {
		return "0"
	}
	return strconv.FormatInt((ms+999)/1000, 10)
}
