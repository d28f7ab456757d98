// Package config reads envoyproxy/ratelimit's configuration files unchanged
// (its README, "The configuration format") and finds the limit of a request's
// descriptor the way the reference service does: the most specific match at
// the same depth, key_value before key, wildcard values, replaces, unlimited,
// shadow_mode, detailed_metric, value_to_metric and share_threshold.
//
// A file that can't be used is refused with its name, the line and the
// reason (Error); the caller keeps serving the last good Config.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"
)

// DefaultMaxLimit is the module's default xcloak.max-limit (docs/commands.md):
// a requests_per_unit above the server's bound would be refused at every call,
// so the loader refuses it first, with the file and the line.
const DefaultMaxLimit = 1_000_000

// Error is a refused configuration file: the file, the line (0 when the file
// as a whole is wrong) and the reason.
type Error struct {
	File   string
	Line   int
	Reason string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Reason)
}

// Limit is one rate_limit block (or a request's own limit override).
type Limit struct {
	// StatsKey names the limit's counters: "domain.key_value.key" as the
	// reference names them (detailed_metric and value_to_metric applied).
	StatsKey        string
	RequestsPerUnit uint32
	Unit            pb.RateLimitResponse_RateLimit_Unit
	// Multiplier is a request override's unit_multiplier (0 or 1: one unit).
	Multiplier     uint32
	Unlimited      bool
	ShadowMode     bool
	Name           string
	Replaces       []string
	DetailedMetric bool
	// File and Line say where the limit was configured ("" for an override).
	File string
	Line int
}

// Window is the sliding window of the limit: one unit (times a request
// override's unit_multiplier).
func (l *Limit) Window() time.Duration {
	if l.Multiplier > 1 {
		return UnitWindow(l.Unit) * time.Duration(l.Multiplier)
	}
	return UnitWindow(l.Unit)
}

// Proto is the limit as the response's current_limit.
func (l *Limit) Proto() *pb.RateLimitResponse_RateLimit {
	return &pb.RateLimitResponse_RateLimit{RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit, Name: l.Name}
}

// UnitWindow is the length of a unit, as the reference counts it (a month
// is 30 days, a year 365).
func UnitWindow(u pb.RateLimitResponse_RateLimit_Unit) time.Duration {
	const day = 24 * time.Hour
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case pb.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case pb.RateLimitResponse_RateLimit_DAY:
		return day
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 7 * day
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 30 * day
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 365 * day
	}
	return 0
}

type wildcard struct {
	key   string   // the child's map key, "key_val*ue"
	parts []string // split on "*"
}

type descriptor struct {
	children       map[string]*descriptor
	wildcards      []wildcard
	limit          *Limit
	valueToMetric  bool
	shareThreshold bool
	pattern        string // the wildcard value, with share_threshold
}

// Config is every domain of a directory of files.
type Config struct {
	domains map[string]*descriptor
	// Files are the files read, in the order read.
	Files []string
	// Limits counts the rate_limit blocks.
	Limits int
}

// Options of a load.
type Options struct {
	// MergeDomains lets several files add to one domain (MERGE_DOMAIN_CONFIG);
	// otherwise a domain configured twice is an error.
	MergeDomains bool
	// MaxLimit is the largest requests_per_unit accepted (default DefaultMaxLimit).
	MaxLimit uint32
}

// LoadDir reads the configuration files of dir (ReadDir) and parses them.
func LoadDir(dir string, opt Options) (*Config, error) {
	files, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	return Parse(files, opt)
}

// ReadDir reads every file under dir, whatever its name, and in its
// subdirectories, as the reference's runtime loader does (a ConfigMap key
// named "ratelimit" or "rules.conf" is a configuration file there too);
// names starting with a dot are skipped, files and directories (a
// ConfigMap's ..data, an editor's .swp, an atomic write's temporary file),
// as the reference does with RUNTIME_IGNOREDOTFILES=true. A symbolic link is
// followed to a file, not to a directory. The map is path -> content.
func ReadDir(dir string) (map[string][]byte, error) {
	if info, err := os.Stat(dir); err != nil {
		return nil, &Error{File: dir, Reason: err.Error()}
	} else if !info.IsDir() {
		return nil, &Error{File: dir, Reason: "not a directory: the configuration is the directory of files"}
	}
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return &Error{File: path, Reason: err.Error()}
		}
		if path == dir {
			return nil
		}
		if strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			return nil
		}
		if e.Type()&os.ModeSymlink != 0 {
			if info, err := os.Stat(path); err == nil && info.IsDir() {
				return nil
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return &Error{File: path, Reason: err.Error()}
		}
		files[path] = data
		return nil
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}

// Parse loads files (name -> content) in name order.
func Parse(files map[string][]byte, opt Options) (*Config, error) {
	if opt.MaxLimit == 0 {
		opt.MaxLimit = DefaultMaxLimit
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	c := &Config{domains: map[string]*descriptor{}}
	for _, name := range names {
		l := loader{file: name, opt: opt, config: c}
		if err := l.load(files[name]); err != nil {
			return nil, err
		}
		c.Files = append(c.Files, name)
	}
	return c, nil
}

// Domains lists the domains configured.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// HasDomain reports whether domain is configured. The reference applies a
// request's own limit override only in a configured domain.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

type loader struct {
	file   string
	opt    Options
	config *Config
}

func (l *loader) fail(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: l.file, Line: line, Reason: fmt.Sprintf(format, args...)}
}

var rootKeys = map[string]bool{"domain": true, "descriptors": true}
var descriptorKeys = map[string]bool{
	"key": true, "value": true, "rate_limit": true, "descriptors": true, "shadow_mode": true, "quota_mode": true,
	"detailed_metric": true, "value_to_metric": true, "share_threshold": true, "metadata": true,
}
var rateLimitKeys = map[string]bool{"unit": true, "requests_per_unit": true, "unlimited": true, "name": true, "replaces": true}

// fields reads a mapping node into key -> (key node, value node), refusing
// keys the reference does not know.
func (l *loader) fields(n *yaml.Node, known map[string]bool, what string) (map[string][2]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, l.fail(n, "%s must be a mapping", what)
	}
	out := map[string][2]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" {
			return nil, l.fail(k, "config error, key is not of type string")
		}
		if !known[k.Value] {
			return nil, l.fail(k, "config error, unknown key '%s'", k.Value)
		}
		if _, dup := out[k.Value]; dup {
			return nil, l.fail(k, "key '%s' is given twice", k.Value)
		}
		out[k.Value] = [2]*yaml.Node{k, v}
	}
	return out, nil
}

func (l *loader) str(f map[string][2]*yaml.Node, key string) (string, error) {
	kv, ok := f[key]
	if !ok || kv[1].Tag == "!!null" {
		return "", nil
	}
	if kv[1].Kind != yaml.ScalarNode {
		return "", l.fail(kv[1], "%s must be a string", key)
	}
	return kv[1].Value, nil
}

func (l *loader) boolean(f map[string][2]*yaml.Node, key string) (bool, error) {
	kv, ok := f[key]
	if !ok || kv[1].Tag == "!!null" {
		return false, nil
	}
	var b bool
	if kv[1].Kind != yaml.ScalarNode || kv[1].Decode(&b) != nil {
		return false, l.fail(kv[1], "%s must be true or false (got %q)", key, kv[1].Value)
	}
	return b, nil
}

func (l *loader) load(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			return &Error{File: l.file, Reason: te.Errors[0]}
		}
		// yaml.v3's syntax errors read "yaml: line N: reason".
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if rest, ok := strings.CutPrefix(msg, "line "); ok {
			if num, reason, ok := strings.Cut(rest, ": "); ok {
				if n, err := strconv.Atoi(num); err == nil {
					return &Error{File: l.file, Line: n, Reason: "error loading config file: " + reason}
				}
			}
		}
		return &Error{File: l.file, Reason: "error loading config file: " + msg}
	}
	if len(doc.Content) == 0 {
		return &Error{File: l.file, Reason: "config file cannot have empty domain"}
	}
	root := doc.Content[0]
	f, err := l.fields(root, rootKeys, "the file")
	if err != nil {
		return err
	}
	domain, err := l.str(f, "domain")
	if err != nil {
		return err
	}
	if domain == "" {
		return l.fail(root, "config file cannot have empty domain")
	}
	d, present := l.config.domains[domain]
	if present && !l.opt.MergeDomains {
		return l.fail(f["domain"][1], "duplicate domain '%s' in config file", domain)
	}
	if !present {
		d = &descriptor{children: map[string]*descriptor{}}
	}
	if kv, ok := f["descriptors"]; ok && kv[1].Tag != "!!null" {
		if err := l.descriptors(d, domain+".", kv[1]); err != nil {
			return err
		}
	}
	l.config.domains[domain] = d
	return nil
}

func (l *loader) descriptors(parent *descriptor, parentKey string, list *yaml.Node) error {
	if list.Kind != yaml.SequenceNode {
		return l.fail(list, "descriptors must be a list")
	}
	for _, n := range list.Content {
		f, err := l.fields(n, descriptorKeys, "a descriptor")
		if err != nil {
			return err
		}
		key, err := l.str(f, "key")
		if err != nil {
			return err
		}
		if key == "" {
			return l.fail(n, "descriptor has empty key")
		}
		value, err := l.str(f, "value")
		if err != nil {
			return err
		}
		finalKey := key
		if value != "" {
			finalKey += "_" + value
		}
		fullKey := parentKey + finalKey
		if _, dup := parent.children[finalKey]; dup {
			return l.fail(n, "duplicate descriptor composite key '%s'", fullKey)
		}
		flags := map[string]bool{}
		for _, name := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
			if flags[name], err = l.boolean(f, name); err != nil {
				return err
			}
		}
		if flags["quota_mode"] {
			return l.fail(f["quota_mode"][0], "quota_mode is not supported by xcloak-ratelimit (every descriptor is decided all or nothing)")
		}
		if flags["share_threshold"] && !strings.Contains(finalKey, "*") {
			return l.fail(f["share_threshold"][0],
				"share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
		}
		child := &descriptor{children: map[string]*descriptor{}, valueToMetric: flags["value_to_metric"], shareThreshold: flags["share_threshold"]}
		if child.shareThreshold {
			child.pattern = finalKey
		}
		if kv, ok := f["rate_limit"]; ok && kv[1].Tag != "!!null" {
			limit, err := l.rateLimit(kv[1], fullKey)
			if err != nil {
				return err
			}
			limit.ShadowMode = flags["shadow_mode"]
			limit.DetailedMetric = flags["detailed_metric"]
			child.limit = limit
			l.config.Limits++
		}
		if strings.Contains(finalKey, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: finalKey, parts: strings.Split(finalKey, "*")})
		}
		if kv, ok := f["descriptors"]; ok && kv[1].Tag != "!!null" {
			if err := l.descriptors(child, fullKey+".", kv[1]); err != nil {
				return err
			}
		}
		parent.children[finalKey] = child
	}
	return nil
}

func (l *loader) rateLimit(n *yaml.Node, fullKey string) (*Limit, error) {
	f, err := l.fields(n, rateLimitKeys, "rate_limit")
	if err != nil {
		return nil, err
	}
	limit := &Limit{StatsKey: fullKey, File: l.file, Line: n.Line}
	if limit.Unlimited, err = l.boolean(f, "unlimited"); err != nil {
		return nil, err
	}
	if limit.Name, err = l.str(f, "name"); err != nil {
		return nil, err
	}
	unitText, err := l.str(f, "unit")
	if err != nil {
		return nil, err
	}
	value, present := pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unitText)]
	validUnit := present && value != int32(pb.RateLimitResponse_RateLimit_UNKNOWN)
	if limit.Unlimited {
		if validUnit {
			return nil, l.fail(f["unit"][1], "should not specify rate limit unit when unlimited")
		}
	} else if !validUnit {
		at := n
		if kv, ok := f["unit"]; ok {
			at = kv[1]
		}
		return nil, l.fail(at, "invalid rate limit unit '%s' (second, minute, hour, day, week, month or year)", unitText)
	}
	limit.Unit = pb.RateLimitResponse_RateLimit_Unit(value)
	if kv, ok := f["requests_per_unit"]; ok && kv[1].Tag != "!!null" {
		var rpu int64
		if kv[1].Kind != yaml.ScalarNode || kv[1].Decode(&rpu) != nil || rpu < 0 {
			return nil, l.fail(kv[1], "requests_per_unit must be an integer from 0 to %d (got %q)", l.opt.MaxLimit, kv[1].Value)
		}
		if rpu > int64(l.opt.MaxLimit) {
			return nil, l.fail(kv[1], "requests_per_unit must be an integer from 0 to %d (got %d): the server's xcloak.max-limit bounds it",
				l.opt.MaxLimit, rpu)
		}
		limit.RequestsPerUnit = uint32(rpu)
	}
	if kv, ok := f["replaces"]; ok && kv[1].Tag != "!!null" {
		if kv[1].Kind != yaml.SequenceNode {
			return nil, l.fail(kv[1], "replaces must be a list of {name: ...}")
		}
		for _, r := range kv[1].Content {
			rf, err := l.fields(r, map[string]bool{"name": true}, "a replaces entry")
			if err != nil {
				return nil, err
			}
			name, err := l.str(rf, "name")
			if err != nil {
				return nil, err
			}
			if name == "" {
				return nil, l.fail(r, "should not have an empty replaces entry")
			}
			if name == limit.Name {
				return nil, l.fail(r, "replaces should not contain name of same descriptor")
			}
			limit.Replaces = append(limit.Replaces, name)
		}
	}
	return limit, nil
}

// Entry is one (key, value) of a request's descriptor.
type Entry struct{ Key, Value string }

// Match is the limit found for a descriptor and the Redis key of its window.
type Match struct {
	Limit *Limit
	// Key identifies the window: the domain and every entry (for an entry
	// matched by a shared wildcard, the wildcard instead of its value).
	Key string
}

// Find returns the limit of a descriptor in domain, or nil when none
// applies (an unknown domain, no match, or a match at another depth).
func (c *Config) Find(domain string, entries []Entry) *Match {
	d := c.domains[domain]
	if d == nil || len(entries) == 0 {
		return nil
	}
	var found *Limit
	shared := make([]string, len(entries)) // share_threshold patterns by entry
	detailed := domain
	enhanced := domain
	prev := d
	children := d.children
	for i, e := range entries {
		finalKey := e.Key + "_" + e.Value
		detailed += "." + finalKey
		next := children[finalKey]
		matchedWildcard := ""
		if next == nil {
			for _, w := range prev.wildcards {
				if wildcardMatch(w.parts, finalKey) {
					next, matchedWildcard = children[w.key], w.key
					break
				}
			}
		}
		matchedValue := next != nil
		if next == nil {
			next = children[e.Key]
		}
		if matchedWildcard != "" && next != nil && next.shareThreshold {
			shared[i] = strings.TrimPrefix(next.pattern, e.Key+"_")
		}
		enhanced += "."
		if next != nil {
			value := ""
			switch {
			case matchedWildcard != "" && shared[i] != "":
				value = strings.TrimSuffix(shared[i], "*")
			case matchedWildcard != "" && next.valueToMetric:
				value = e.Value
			case matchedWildcard != "":
				value = strings.TrimPrefix(matchedWildcard, e.Key+"_")
			case matchedValue:
				value = e.Value
			case next.valueToMetric:
				value = e.Value
			}
			enhanced += e.Key
			if value != "" {
				enhanced += "_" + value
			}
		} else {
			enhanced += e.Key
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			copied := *next.limit
			found = &copied
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		prev, children = next, next.children
	}
	if found == nil {
		return nil
	}
	switch {
	case found.DetailedMetric && anyShared(shared):
		// share_threshold keeps its wildcard in the detailed key too, as
		// the reference does: one counter for the values that share a window.
		key := statsKey(domain, entries, shared)
		found.StatsKey = key
	case found.DetailedMetric:
		found.StatsKey = detailed
	default:
		found.StatsKey = enhanced
	}
	return &Match{Limit: found, Key: windowKey(domain, entries, shared)}
}

func anyShared(shared []string) bool {
	for _, p := range shared {
		if p != "" {
			return true
		}
	}
	return false
}

// OverrideKey is the window of a descriptor that carries its own limit of
// the given window length. The length is part of the key: the same entries
// may be sent with an override on one route and without (the configured
// limit, under Find's key) on another, or with overrides of other units, and
// one sorted set decided with two window lengths loses the longer window's
// entries to the shorter one's trimming.
func OverrideKey(domain string, entries []Entry, window time.Duration) string {
	return windowKey(domain, entries, nil) + "_override_" + strconv.FormatInt(window.Milliseconds(), 10)
}

// value is an entry's value in a key, or the wildcard it shares a window
// by (share_threshold) when shared names one.
func value(e Entry, i int, shared []string) string {
	if i < len(shared) && shared[i] != "" {
		return shared[i]
	}
	return e.Value
}

// windowKey names a window: the domain and every entry, "_" between.
func windowKey(domain string, entries []Entry, shared []string) string {
	key := domain
	for i, e := range entries {
		key += "_" + e.Key + "_" + value(e, i, shared)
	}
	return key
}

// statsKey names counters: the domain and every entry, "." between, a value
// after its key only when there is one.
func statsKey(domain string, entries []Entry, shared []string) string {
	key := domain
	for i, e := range entries {
		key += "." + e.Key
		if v := value(e, i, shared); v != "" {
			key += "_" + v
		}
	}
	return key
}

// StatsKey is the counters' key of a descriptor with its own limit.
func StatsKey(domain string, entries []Entry) string { return statsKey(domain, entries, nil) }

// wildcardMatch reports whether value matches a pattern split on "*": each
// "*" matches zero or more characters.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	if !strings.HasPrefix(value, parts[0]) || !strings.HasSuffix(value, parts[len(parts)-1]) {
		return false
	}
	fixed := 0
	for _, p := range parts {
		fixed += len(p)
	}
	if len(value) < fixed {
		return false
	}
	rest := value[len(parts[0]) : len(value)-len(parts[len(parts)-1])]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
