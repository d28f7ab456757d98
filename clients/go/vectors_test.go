package xcloak

// The conformance vectors (clients/conformance/vectors.json) drive the pure
// core here without a server: reply -> Decision, Decision -> headers, the
// canonical command, and acquire's plan. vectors_live_test.go runs every
// vector again through the Limiter against live servers.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

type vectorFile struct {
	Schema int          `json:"schema"`
	Cases  []vectorCase `json:"cases"`
}

type vectorCase struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Steps       []step `json:"steps"`
}

// step is one step of a case; numbers stay json.Number (exact up to 2^53).
type step struct {
	Op       string                       `json:"op"`
	Key      string                       `json:"key"`
	Window   json.Number                  `json:"window"`
	Limit    json.Number                  `json:"limit"`
	Tiers    [][]json.Number              `json:"tiers"`
	Cost     *json.Number                 `json:"cost"`
	Now      *json.Number                 `json:"now"`
	Stamp    json.RawMessage              `json:"stamp"`     // true (allow) or a number (refund)
	Oldest   bool                         `json:"oldest"`    // peek: OLDEST asked
	OldestMs *json.Number                 `json:"oldest_ms"` // its reply: the oldest live entry, null for none
	Names    json.RawMessage              `json:"names"`     // []string (allow) or [][]string (allow_all)
	Command  []string                     `json:"command"`
	Reply    interface{}                  `json:"reply"`
	Decision *vectorDecision              `json:"decision"`
	Headers  map[string]map[string]string `json:"headers"`
	Error    *string                      `json:"error"`
	Removed  *json.Number                 `json:"removed"`
	Existed  *bool                        `json:"existed"`
	// acquire
	Start          json.Number `json:"start"`
	MaxWaitMs      json.Number `json:"max_wait_ms"`
	JitterFraction float64     `json:"jitter_fraction"`
	Random         []float64   `json:"random"`
	Calls          []struct {
		Now     json.Number  `json:"now"`
		Command []string     `json:"command"`
		Reply   interface{}  `json:"reply"`
		SleepMs *json.Number `json:"sleep_ms"`
	} `json:"calls"`
	Outcome string `json:"outcome"`
	// allow_all
	Requests []struct {
		Key    string          `json:"key"`
		Window json.Number     `json:"window"`
		Limit  json.Number     `json:"limit"`
		Tiers  [][]json.Number `json:"tiers"`
		Cost   *json.Number    `json:"cost"`
	} `json:"requests"`
	Allowed   *bool            `json:"allowed"`
	Rejected  *int             `json:"rejected"`
	Binding   int              `json:"binding"`
	Decisions []vectorDecision `json:"decisions"`
}

type vectorDecision struct {
	Allowed          bool         `json:"allowed"`
	Limit            int          `json:"limit"`
	Remaining        int          `json:"remaining"`
	RetryAfterMs     json.Number  `json:"retry_after_ms"`
	ResetAfterMs     json.Number  `json:"reset_after_ms"`
	CostExceedsLimit bool         `json:"cost_exceeds_limit"`
	WindowMs         json.Number  `json:"window_ms"`
	Tier             int          `json:"tier"`
	Tiers            []vectorTier `json:"tiers"`
	Stamp            *json.Number `json:"stamp"`
}

type vectorTier struct {
	WindowMs     json.Number `json:"window_ms"`
	Limit        int         `json:"limit"`
	Remaining    int         `json:"remaining"`
	RetryAfterMs json.Number `json:"retry_after_ms"`
	ResetAfterMs json.Number `json:"reset_after_ms"`
}

func loadVectors(t testing.TB) vectorFile {
	t.Helper()
	path := filepath.Join(testserver.Repo(), "clients/conformance/vectors.json")
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the conformance vectors: %v", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber()
	var v vectorFile
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if v.Schema != 1 || len(v.Cases) == 0 {
		t.Fatalf("%s: schema %d, %d cases", path, v.Schema, len(v.Cases))
	}
	return v
}

func num(n json.Number) int64 {
	v, err := n.Int64()
	if err != nil {
		panic(fmt.Sprintf("vector number %q: %v", n, err))
	}
	return v
}

// goReply is a vector's reply as go-redis hands it over: integers as int64,
// arrays as []interface{}.
func goReply(v interface{}) interface{} {
	switch x := v.(type) {
	case json.Number:
		return num(x)
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = goReply(e)
		}
		return out
	}
	return v
}

func (s step) stampAsked() bool { return string(s.Stamp) == "true" }

func (s step) names() []string {
	var names []string
	if len(s.Names) > 0 {
		_ = json.Unmarshal(s.Names, &names)
	}
	return names
}

func (s step) requestNames() [][]string {
	var names [][]string
	if len(s.Names) > 0 {
		_ = json.Unmarshal(s.Names, &names)
	}
	return names
}

// checkDecision compares a Decision with a vector's Decision, after mapping the
// milliseconds onto Durations (saturated at Duration's maximum).
func checkDecision(t *testing.T, where string, got Decision, want vectorDecision) {
	t.Helper()
	expect := Decision{
		Allowed: want.Allowed, Limit: want.Limit, Remaining: want.Remaining,
		RetryAfter: duration(num(want.RetryAfterMs)), ResetAfter: duration(num(want.ResetAfterMs)),
		CostExceedsLimit: want.CostExceedsLimit, Window: duration(num(want.WindowMs)), Tier: want.Tier, Stamp: -1,
	}
	if want.Stamp != nil {
		expect.Stamp = num(*want.Stamp)
	}
	for _, tr := range want.Tiers {
		expect.Tiers = append(expect.Tiers, TierState{
			Window: duration(num(tr.WindowMs)), Limit: tr.Limit, Remaining: tr.Remaining,
			RetryAfter: duration(num(tr.RetryAfterMs)), ResetAfter: duration(num(tr.ResetAfterMs)),
		})
	}
	public := func(r Decision) string {
		var tiers []string
		for _, tr := range r.Tiers {
			tiers = append(tiers, fmt.Sprintf("{%d %d %d %d %d}", tr.Window, tr.Limit, tr.Remaining, tr.RetryAfter, tr.ResetAfter))
		}
		return fmt.Sprintf("allowed=%v limit=%d remaining=%d retry=%d reset=%d never=%v window=%d tier=%d tiers=%v stamp=%d",
			r.Allowed, r.Limit, r.Remaining, r.RetryAfter, r.ResetAfter, r.CostExceedsLimit, r.Window, r.Tier, tiers, r.Stamp)
	}
	if g, w := public(got), public(expect); g != w {
		t.Errorf("%s:\n got  %s\n want %s", where, g, w)
	}
}

// checkHeaders compares h with a vector's headers of one style (names
// compare without case, as in HTTP).
func checkHeaders(t *testing.T, where string, h http.Header, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for name, values := range h {
		got[strings.ToLower(name)] = strings.Join(values, "\n")
	}
	expect := map[string]string{}
	for name, value := range want {
		expect[strings.ToLower(name)] = value
	}
	if !reflect.DeepEqual(got, expect) {
		t.Errorf("%s headers:\n got  %v\n want %v", where, got, expect)
	}
}

func checkAllHeaders(t *testing.T, where string, want map[string]map[string]string, headers func(Style) http.Header) {
	t.Helper()
	checkHeaders(t, where+" ietf", headers(StyleIETF), want["ietf"])
	checkHeaders(t, where+" (zero Style)", headers(""), want["ietf"])
	checkHeaders(t, where+" legacy", headers(StyleLegacy), want["legacy"])
	both := map[string]string{}
	for _, style := range []string{"ietf", "legacy"} {
		for k, v := range want[style] {
			both[k] = v
		}
	}
	checkHeaders(t, where+" both", headers(StyleBoth), both)
}

// vectorCall is a step's arguments as the package's call (windows in
// milliseconds: some are beyond Duration's range).
func vectorCall(key string, window, limit json.Number, tiers [][]json.Number, cost, now *json.Number, stamp bool) *call {
	c := &call{key: key, windowMs: num(window), limit: int(num(limit)), stamp: stamp}
	for _, tr := range tiers {
		c.tiers = append(c.tiers, tierArg{windowMs: num(tr[0]), limit: int(num(tr[1]))})
	}
	if cost != nil {
		c.cost, c.hasCost = int(num(*cost)), true
	}
	if now != nil {
		c.now, c.hasNow = num(*now), true
	}
	return c
}

func (s step) call() *call {
	c := vectorCall(s.Key, s.Window, s.Limit, s.Tiers, s.Cost, s.Now, s.stampAsked())
	c.oldest = s.Oldest
	return c
}

// checkOldest compares Decision.Oldest with a peek step's oldest_ms (null:
// -1); a step that did not ask must get -1.
func checkOldest(t *testing.T, where string, got Decision, s step) {
	t.Helper()
	want := int64(-1)
	if s.Oldest && s.OldestMs != nil {
		want = num(*s.OldestMs)
	}
	if got.Oldest != want || got.HasOldest() != (want >= 0) {
		t.Errorf("%s: oldest %d (HasOldest %v), want %d", where, got.Oldest, got.HasOldest(), want)
	}
}

// commandLine is name key args..., args as call.args makes them (behind
// argsAfterKey free slots).
func commandLine(name, key string, args []interface{}) []string {
	out := []string{name, key}
	for _, a := range args[argsAfterKey:] {
		out = append(out, fmt.Sprint(a))
	}
	return out
}

// TestVectorsPure drives the pure core by every vector, without a server.
// Catches: a reply field read from the wrong place, the binding tier not
// the first that matches, a duration not saturated (or -1 not kept), seconds
// rounded down, a default policy name in the wrong shape, Retry-After on a
// never-fits request, COST 1 sent, DETAILS before NOW, the jitter
// subtracted, a sleep past the deadline, OLDEST not sent or its entry read
// from the wrong place (or kept as a stamp).
func TestVectorsPure(t *testing.T) {
	v := loadVectors(t)
	steps := 0
	for _, vc := range v.Cases {
		for i, s := range vc.Steps {
			where := fmt.Sprintf("%s step %d (%s)", vc.Name, i, s.Op)
			switch s.Op {
			case "allow", "peek":
				steps++
				c := s.call()
				name := "XCLOAK.ALLOW"
				if s.Op == "peek" {
					name = "XCLOAK.PEEK"
				}
				if got := commandLine(name, c.key, c.args(s.Op == "allow")); !reflect.DeepEqual(got, s.Command) {
					t.Errorf("%s command:\n got  %q\n want %q", where, got, s.Command)
				}
				if s.Error != nil {
					continue
				}
				r, err := parseDecision(goReply(s.Reply), c.windowMs, len(c.tiers) > 0, c.stamp, c.oldest)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				checkDecision(t, where, r, *s.Decision)
				checkOldest(t, where, r, s)
				names := s.names()
				checkAllHeaders(t, where, s.Headers, func(style Style) http.Header { return r.Headers(style, names...) })
			case "refund":
				steps++
				c := &call{key: s.Key}
				if s.Cost != nil {
					c.cost, c.hasCost = int(num(*s.Cost)), true
				}
				args := make([]interface{}, argsAfterKey, argsAfterKey+3)
				args = append(args, num(json.Number(string(s.Stamp))))
				if c.hasCost && c.cost != 1 {
					args = append(args, "COST", int64(c.cost))
				}
				if got := commandLine("XCLOAK.REFUND", s.Key, args); !reflect.DeepEqual(got, s.Command) {
					t.Errorf("%s command:\n got  %q\n want %q", where, got, s.Command)
				}
			case "acquire":
				steps++
				testAcquirePlan(t, where, s)
			case "allow_all":
				steps++
				var m MultiDecision
				m.Rejected, m.BindingIndex = -1, s.Binding
				if s.Rejected != nil {
					m.Rejected = *s.Rejected
				}
				for j := range s.Decisions {
					rq := s.Requests[j]
					c := vectorCall(rq.Key, rq.Window, rq.Limit, rq.Tiers, rq.Cost, s.Now, true)
					if got := commandLine("XCLOAK.ALLOW", c.key, c.args(true)); !reflect.DeepEqual(got, s.Calls[j].Command) {
						t.Errorf("%s call %d:\n got  %q\n want %q", where, j, got, s.Calls[j].Command)
					}
					r, err := parseDecision(goReply(s.Calls[j].Reply), c.windowMs, len(c.tiers) > 0, true, false)
					if err != nil {
						t.Fatalf("%s call %d: %v", where, j, err)
					}
					checkDecision(t, fmt.Sprintf("%s decision %d", where, j), r, s.Decisions[j])
					m.Decisions = append(m.Decisions, r)
				}
				names := s.requestNames()
				checkAllHeaders(t, where, s.Headers, func(style Style) http.Header { return m.Headers(style, names...) })
			}
		}
	}
	if steps < 150 {
		t.Fatalf("only %d steps checked", steps)
	}
	t.Logf("%d steps of %d cases checked", steps, len(v.Cases))
}

// testAcquirePlan replays an acquire vector's calls through acquireSleep:
// each rejection's sleep, and the stop at the last call.
func testAcquirePlan(t *testing.T, where string, s step) {
	t.Helper()
	deadline := num(s.Start) + num(s.MaxWaitMs)
	draws := append([]float64{}, s.Random...)
	random := func() float64 {
		if len(draws) == 0 {
			t.Fatalf("%s: more random draws than the vector gives", where)
		}
		u := draws[0]
		draws = draws[1:]
		return u
	}
	c := vectorCall(s.Key, s.Window, s.Limit, s.Tiers, s.Cost, nil, false)
	for j, call := range s.Calls {
		r, err := parseDecision(goReply(call.Reply), c.windowMs, len(c.tiers) > 0, false, false)
		if err != nil {
			t.Fatalf("%s call %d: %v", where, j, err)
		}
		left := time.Duration(deadline-num(call.Now)) * time.Millisecond
		last := j == len(s.Calls)-1
		switch {
		case r.Allowed || r.CostExceedsLimit:
			if !last {
				t.Errorf("%s call %d: admitted or never-fits before the last call", where, j)
			}
			outcome := map[bool]string{true: "admitted", false: "never"}[r.Allowed]
			if outcome != s.Outcome {
				t.Errorf("%s: outcome %s, want %s", where, outcome, s.Outcome)
			}
		default:
			sleep, ok := acquireSleep(r.msRetry(), left, s.JitterFraction, random)
			if last {
				if ok || s.Outcome != "deadline" {
					t.Errorf("%s call %d: would sleep %v (ok=%v), the vector stops (%s)", where, j, sleep, ok, s.Outcome)
				}
			} else if !ok || call.SleepMs == nil || sleep != time.Duration(num(*call.SleepMs))*time.Millisecond {
				t.Errorf("%s call %d: sleep %v (ok=%v), want %v ms", where, j, sleep, ok, call.SleepMs)
			}
		}
	}
	if len(draws) != 0 {
		t.Errorf("%s: %d random draws left unused", where, len(draws))
	}
}

// TestDurationSaturates: 2^53-1 ms is about 285,616 years, beyond a
// Duration's 292: it saturates at the maximum, while the headers keep the
// server's exact seconds. Catches an overflow into a negative Duration.
func TestDurationSaturates(t *testing.T) {
	for ms, want := range map[int64]time.Duration{
		-1: -1, 0: 0, 1: time.Millisecond, maxDurationMs: time.Duration(maxDurationMs) * time.Millisecond,
		maxDurationMs + 1: math.MaxInt64, 9007199254740991: math.MaxInt64,
	} {
		if got := duration(ms); got != want {
			t.Errorf("duration(%d ms) = %d, want %d", ms, got, want)
		}
	}
	r, err := parseDecision([]interface{}{int64(0), int64(2), int64(0), int64(9007199254740989), int64(9007199254740990)}, 9007199254740991, false, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.RetryAfter != math.MaxInt64 || r.Window != math.MaxInt64 {
		t.Errorf("not saturated: %+v", r)
	}
	if h := r.Headers(StyleBoth); h.Get("Retry-After") != "9007199254741" || h.Get("RateLimit-Policy") != `"2-in-9007199254740991ms";q=2;w=9007199254741` {
		t.Errorf("headers of a saturated Decision: %v", h)
	}
}

// TestHandBuiltResultHeaders: a Decision made by hand (no reply behind it)
// gets its headers from its Durations, rounded up.
func TestHandBuiltResultHeaders(t *testing.T) {
	r := Decision{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 59001 * time.Millisecond, Window: time.Minute, Stamp: -1}
	h := r.Headers(StyleBoth)
	want := map[string]string{
		"RateLimit-Policy": `"3-in-60s";q=3;w=60`, "RateLimit": `"3-in-60s";r=0;t=60`,
		"RateLimit-Limit": "3", "RateLimit-Remaining": "0", "RateLimit-Reset": "60", "Retry-After": "2",
	}
	checkHeaders(t, "hand-built", h, want)
	if h := policyDecision(true, 3, 60000, fmt.Errorf("down")).Headers(StyleBoth); len(h) != 0 {
		t.Errorf("a Decision of the error policy has headers: %v", h)
	}
}
