// Package nethttp is net/http middleware on an xcloak Limiter: exact
// sliding-window limits per route, with the IETF RateLimit headers.
//
//	limiter, err := xcloak.NewLimiter(rdb, xcloak.Options{OnError: xcloak.PolicyDeny})
//	...
//	mw, err := nethttp.New(limiter, nethttp.Options{
//		Limits: []nethttp.Limit{
//			{Name: "ip", Window: time.Minute, Limit: 100},
//			{Name: "burst", Window: time.Second, Limit: 10, Tiers: []xcloak.Tier{{Window: time.Hour, Limit: 2000}}},
//		},
//	})
//	if err != nil {
//		log.Fatal(err) // a window, limit, cost or tier out of range, named
//	}
//	http.Handle("/api/", mw.Handler(api))
//
// New checks the configuration when it is built and returns an
// *xcloak.Error naming the argument and its range: a bad limit is found at
// startup, never at the first request and never through the error policy.
//
// Each request is admitted by every limit or by none (Limiter.AllowAll, on
// the keys rl:<name>:<client key>). A rejected one gets 429 Too Many
// Requests with RateLimit-Policy, RateLimit and Retry-After (Options.Style
// picks the fields); an admitted one gets the same headers. A rejection the
// Limiter's block cache answers (xcloak.Options.BlockCache) is the same 429
// with the same headers, its Retry-After counting down, and sends nothing. When Redis does
// not answer, the Limiter's error policy decides: PolicyRaise answers with
// Options.ErrorHandler (by default a line in the standard logger and 500), PolicyAllow serves the request
// without headers, PolicyDeny answers 503 Service Unavailable.
//
// SkipSuccessful and SkipFailed count only the requests that failed, or
// only those that succeeded (status < 400 is a success): the request is
// admitted with a stamp, and once the handler has answered, its own
// admission is refunded (XCLOAK.REFUND key stamp). Never PEEK-then-ALLOW:
// under concurrency that lets a burst through. A request still in flight
// holds its slot until that refund: with a limit of 10, 11 concurrent
// successful requests still get one 429.
//
// The handler finds the request's decision with DecisionFromContext.
package nethttp

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/check"
)

// Limit is one limit of a route: at most Limit per Window (and each tier's
// limit per its window) for each client key.
type Limit struct {
	// Name makes the keys rl:<Name>:<client key> (default "http").
	Name   string
	Window time.Duration
	Limit  int
	Tiers  []xcloak.Tier
	// Cost of one request in units (default 1).
	Cost int
	// Names names this limit's tiers in the headers, one per tier at most
	// (default "<limit>-in-<s>s").
	Names []string
}

// Options configure the middleware.
type Options struct {
	// Limits are checked together, all or nothing.
	Limits []Limit
	// Key is the client key of a request (default: the client's address,
	// see TrustedProxies). An error answers 500 through ErrorHandler.
	Key func(r *http.Request) (string, error)
	// TrustedProxies are the proxies whose X-Forwarded-For (or Forwarded)
	// is believed: the client's address is then the rightmost one of the
	// chain that is not a trusted proxy. Without them the headers are
	// ignored (a client could write them).
	TrustedProxies []netip.Prefix
	// SkipSuccessful refunds a request once the handler answered < 400.
	SkipSuccessful bool
	// SkipFailed refunds a request once the handler answered >= 400.
	SkipFailed bool
	// Style of the headers (default xcloak.StyleIETF).
	Style xcloak.Style
	// ErrorHandler answers when the Limiter returns an error: an outage
	// under PolicyRaise, a refused argument, a Key error (default: the error
	// on the standard logger, and 500).
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
}

// Middleware limits the requests of the handlers it wraps.
type Middleware struct {
	limiter *xcloak.Limiter
	opt     Options
	names   [][]string
	prefix  []string // "rl:<name>:" per limit
}

// New returns the middleware for opt on l, or an *xcloak.Error naming the
// first argument out of range:
//
//   - l is not nil; Limits holds at least one Limit, with distinct Names
//     (the same name would be the same key);
//   - each Limit's Window, and each tier's, is a whole number of
//     milliseconds from 1ms; Limit, and each tier's, is from 1
//     to 1,000,000; at most 15 Tiers; Cost from 0 (1) to the smallest limit
//     of its tiers; at most one name per tier in Names;
//   - Style is "", StyleIETF, StyleLegacy or StyleBoth; SkipSuccessful and
//     SkipFailed are not both set (nothing would be counted).
func New(l *xcloak.Limiter, opt Options) (*Middleware, error) {
	if err := opt.check(l); err != nil {
		return nil, err
	}
	m := &Middleware{limiter: l, opt: opt}
	if m.opt.ErrorHandler == nil {
		m.opt.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
			log.Printf("xcloak/nethttp: %s %s: %v", r.Method, r.URL.Path, err)
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		}
	}
	for _, lim := range opt.Limits {
		m.names = append(m.names, lim.Names)
		m.prefix = append(m.prefix, "rl:"+limitName(lim)+":")
	}
	return m, nil
}

func limitName(lim Limit) string {
	if lim.Name == "" {
		return "http"
	}
	return lim.Name
}

// check refuses a configuration New can't serve with.
func (opt Options) check(l *xcloak.Limiter) error {
	refuse := func(format string, args ...interface{}) error {
		return &xcloak.Error{Message: "xcloak/nethttp: " + fmt.Sprintf(format, args...)}
	}
	if l == nil {
		return refuse("New needs an *xcloak.Limiter, not nil")
	}
	if len(opt.Limits) == 0 {
		return refuse("Options.Limits must hold at least one Limit")
	}
	seen := map[string]int{}
	for i, lim := range opt.Limits {
		where := "xcloak/nethttp: Limits[" + strconv.Itoa(i) + "]"
		if err := check.Limit(where, lim.Window, lim.Limit, lim.Tiers, lim.Cost); err != nil {
			return err
		}
		if len(lim.Names) > len(lim.Tiers)+1 {
			return refuse("Limits[%d].Names must hold at most one name per tier (%d), not %d", i, len(lim.Tiers)+1, len(lim.Names))
		}
		name := limitName(lim)
		if j, dup := seen[name]; dup {
			return refuse("Limits[%d].Name %q is Limits[%d]'s too: their keys would be the same (rl:%s:<client key>)", i, name, j, name)
		}
		seen[name] = i
	}
	switch opt.Style {
	case "", xcloak.StyleIETF, xcloak.StyleLegacy, xcloak.StyleBoth:
	default:
		return refuse("Options.Style must be StyleIETF, StyleLegacy or StyleBoth, not %q", string(opt.Style))
	}
	if opt.SkipSuccessful && opt.SkipFailed {
		return refuse("Options.SkipSuccessful and Options.SkipFailed can't both be set: every request would be refunded")
	}
	return nil
}

// decisionKey is the context key of the request's decision.
type decisionKey struct{}

// DecisionFromContext is the decision the middleware took for the request
// whose context is ctx (r.Context() in the handler it wraps): every limit's
// Decision, in the order of Options.Limits, and the binding one. ok is
// false outside the middleware, and when the error policy answered.
func DecisionFromContext(ctx context.Context) (d xcloak.MultiDecision, ok bool) {
	d, ok = ctx.Value(decisionKey{}).(xcloak.MultiDecision)
	return d, ok
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.clientKey(r)
	if err != nil {
		m.opt.ErrorHandler(w, r, err)
		return
	}
	requests := make([]xcloak.Request, len(m.opt.Limits))
	for i, lim := range m.opt.Limits {
		requests[i] = xcloak.Request{Key: m.prefix[i] + key, Window: lim.Window, Limit: lim.Limit, Tiers: lim.Tiers, Cost: lim.Cost}
	}
	res, err := m.limiter.AllowAll(r.Context(), requests)
	if err != nil {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			return // the client went away
		}
		m.opt.ErrorHandler(w, r, err)
		return
	}
	if len(res.Decisions) > 0 && res.Binding.Via == xcloak.ViaError {
		if !res.Allowed {
			http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r) // PolicyAllow: served, without headers
		return
	}
	for name, values := range res.Headers(m.opt.Style, m.names...) {
		w.Header()[name] = values
	}
	if !res.Allowed {
		body := "Too Many Requests: try again after the Retry-After seconds"
		if res.Binding.CostExceedsLimit {
			body = "Too Many Requests: the request is larger than the limit, and will never be admitted"
		}
		http.Error(w, body, http.StatusTooManyRequests)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, res))
	if !m.opt.SkipSuccessful && !m.opt.SkipFailed {
		next.ServeHTTP(w, r)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	next.ServeHTTP(rec, r)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if (status < 400 && m.opt.SkipSuccessful) || (status >= 400 && m.opt.SkipFailed) {
		// The request's own admissions, by their stamps, after the response;
		// a refund that fails leaves them (conservative).
		ctx := context.WithoutCancel(r.Context())
		for i, d := range res.Decisions {
			cost := max(requests[i].Cost, 1)
			_, _ = m.limiter.Refund(ctx, requests[i].Key, d.Stamp, xcloak.WithCost(cost))
		}
	}
}

// statusRecorder remembers the status the handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer's Flush, Hijack...
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// clientKey is Options.Key's, or the client's address.
func (m *Middleware) clientKey(r *http.Request) (string, error) {
	if m.opt.Key != nil {
		return m.opt.Key(r)
	}
	return ClientAddr(r, m.opt.TrustedProxies), nil
}

// ClientAddr is the address of the client of r: the peer's, or with trusted
// proxies the rightmost address of X-Forwarded-For (else Forwarded's for=)
// and the peer that is not one of them.
func ClientAddr(r *http.Request, trusted []netip.Prefix) string {
	peer := r.RemoteAddr
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	if len(trusted) == 0 {
		return peer
	}
	chain := forwardedFor(r)
	chain = append(chain, peer)
	for i := len(chain) - 1; i >= 0; i-- {
		addr, err := netip.ParseAddr(chain[i])
		if err != nil {
			return chain[i] // not an address: nothing before it can be believed
		}
		if !isTrusted(addr.Unmap(), trusted) {
			return addr.Unmap().String()
		}
	}
	return chain[0]
}

func isTrusted(addr netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// forwardedFor is the address chain of X-Forwarded-For, or of Forwarded's
// for= parameters, in order (every header line, joined).
func forwardedFor(r *http.Request) []string {
	var chain []string
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		for _, line := range xff {
			for _, a := range strings.Split(line, ",") {
				if a = strings.TrimSpace(a); a != "" {
					chain = append(chain, a)
				}
			}
		}
		return chain
	}
	for _, line := range r.Header.Values("Forwarded") {
		for _, element := range strings.Split(line, ",") {
			for _, pair := range strings.Split(element, ";") {
				name, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if !ok || !strings.EqualFold(name, "for") {
					continue
				}
				value = strings.Trim(value, `"`)
				if host, _, err := net.SplitHostPort(value); err == nil {
					value = host
				}
				chain = append(chain, strings.Trim(value, "[]"))
			}
		}
	}
	return chain
}
