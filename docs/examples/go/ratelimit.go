// Rate limiting an HTTP endpoint with XCLOAK.ALLOW, from Go, on go-redis v9
// and the xcloak Go package (clients/go).
//
// The article's naive pipeline, in Go: two round trips, and every caller
// that counts before another one adds is admitted too (24 admitted for a
// limit of 10 under 100 concurrent clients, see docs/design.md):
//
//	pipe := rdb.Pipeline()
//	pipe.ZRemRangeByScore(ctx, key, "-inf", windowStart)
//	pipe.ZCard(ctx, key)
//	cmds, _ := pipe.Exec(ctx)
//	if cmds[1].(*redis.IntCmd).Val() < limit {
//		rdb.ZAdd(ctx, key, redis.Z{Score: now, Member: now}) // admitted, raced
//	}
//
// Its replacement, one atomic call (same keys, same scores), with the
// figures of the HTTP response:
//
//	limiter, err := xcloak.NewLimiter(rdb, xcloak.Options{})
//	res, err := limiter.Allow(ctx, key, time.Minute, 100) // XCLOAK.ALLOW key 60000 100 DETAILS
//	// res.Allowed, res.Remaining, res.RetryAfter, res.ResetAfter; res.Headers(xcloak.StyleLegacy)
//
// Where the server does not have the module (a managed service), it answers
// "ERR unknown command": the Limiter then runs the portable Lua script
// instead (EVALSHA, then EVAL when the server answers NOSCRIPT). Both keep
// the same sorted set. With --cluster the client is a redis.ClusterClient,
// which sends every call to its key's node; --peek asks XCLOAK.PEEK, which a
// replica answers (ClusterOptions.ReadOnly).
//
// Build and run (Go 1.24+, modules from the Go module proxy; go.mod points
// at ../../../clients/go):
//
//	cd docs/examples/go && go build -o ratelimit . && cd -
//	docs/examples/go/ratelimit redis://127.0.0.1:6379/ user:42 60000 3 4 [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
//	200 RateLimit-Limit: 3 | RateLimit-Remaining: 2 | RateLimit-Reset: 60 | via command
//	...
//	429 RateLimit-Limit: 3 | RateLimit-Remaining: 0 | RateLimit-Reset: 60 | Retry-After: 60 | via command
//
// With --keys K, request i uses the key KEY:<i mod K>. Each --tier
// WINDOW_MS:LIMIT adds `TIER window limit` to the call; the line then shows
// the IETF RateLimit-Policy and RateLimit fields, one policy per tier, named
// by its window (docs/commands.md, "Several tiers"):
//
//	200 RateLimit-Policy: "60000ms";q=3;w=60, "3600000ms";q=5;w=3600 | RateLimit: "60000ms";r=2;t=60, "3600000ms";r=4;t=3600 | via command
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
)

// options is the command line: URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]...
type options struct {
	url, key      string
	window        time.Duration
	limit, calls  int
	cluster, peek bool
	keys          int
	tiers         []xcloak.Tier
}

const usage = "usage: ratelimit REDIS_URL KEY WINDOW_MS LIMIT CALLS [--cluster] [--keys K] [--peek] [--tier WINDOW_MS:LIMIT]..."

func parseArgs(args []string) (options, error) {
	var o options
	var positional []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--cluster":
			o.cluster = true
		case "--peek":
			o.peek = true
		case "--keys", "--tier":
			if i+1 == len(args) {
				return o, fmt.Errorf("%s needs a value", args[i])
			}
			i++
			if args[i-1] == "--keys" {
				k, err := strconv.Atoi(args[i])
				if err != nil || k < 1 {
					return o, fmt.Errorf("--keys must be a positive integer, not %q", args[i])
				}
				o.keys = k
				continue
			}
			window, limit, ok := strings.Cut(args[i], ":")
			w, errW := strconv.ParseInt(window, 10, 64)
			l, errL := strconv.Atoi(limit)
			if !ok || errW != nil || errL != nil {
				return o, fmt.Errorf("--tier needs WINDOW_MS:LIMIT, not %q", args[i])
			}
			o.tiers = append(o.tiers, xcloak.Tier{Window: time.Duration(w) * time.Millisecond, Limit: l})
		default:
			if strings.HasPrefix(args[i], "--") {
				return o, fmt.Errorf("unknown option %s", args[i])
			}
			positional = append(positional, args[i])
		}
	}
	if len(positional) != 5 {
		return o, errors.New(usage)
	}
	o.url, o.key = positional[0], positional[1]
	numbers := make([]int, 3)
	for i, name := range []string{"WINDOW_MS", "LIMIT", "CALLS"} {
		n, err := strconv.Atoi(positional[2+i])
		if err != nil || n < 0 {
			return o, fmt.Errorf("%s must be a non-negative integer, not %q", name, positional[2+i])
		}
		numbers[i] = n
	}
	o.window, o.limit, o.calls = time.Duration(numbers[0])*time.Millisecond, numbers[1], numbers[2]
	return o, nil
}

// client is a redis.Client on the URL, or with --cluster a ClusterClient
// starting from it (the URL's user and password apply to every node).
func client(o options) (redis.UniversalClient, error) {
	if !o.cluster {
		opt, err := redis.ParseURL(o.url)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(opt), nil
	}
	opt, err := redis.ParseClusterURL(o.url)
	if err != nil {
		return nil, err
	}
	opt.ReadOnly = o.peek // PEEK to a replica of the key's primary
	return redis.NewClusterClient(opt), nil
}

// line is the HTTP decision as one line: the status, the header fields in a
// fixed order, and who answered.
func line(r xcloak.Decision, names []string) string {
	status := 200
	if !r.Allowed {
		status = 429
	}
	style, order := xcloak.StyleLegacy, []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	if len(r.Tiers) > 0 {
		style, order = xcloak.StyleIETF, []string{"RateLimit-Policy", "RateLimit"}
	}
	h := r.Headers(style, names...)
	var fields []string
	for _, name := range append(order, "Retry-After") {
		if v := h.Get(name); v != "" {
			fields = append(fields, name+": "+v)
		}
	}
	return fmt.Sprintf("%d %s | via %s", status, strings.Join(fields, " | "), r.Via)
}

func run(args []string) error {
	o, err := parseArgs(args)
	if err != nil {
		return err
	}
	rdb, err := client(o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	limiter, err := xcloak.NewLimiter(rdb, xcloak.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	// With tiers, each policy is named by its window.
	var names []string
	var opts []xcloak.CallOption
	if len(o.tiers) > 0 {
		names = append(names, fmt.Sprintf("%dms", o.window.Milliseconds()))
		for _, t := range o.tiers {
			names = append(names, fmt.Sprintf("%dms", t.Window.Milliseconds()))
		}
		opts = append(opts, xcloak.WithTiers(o.tiers...))
	}
	ctx := context.Background()
	for i := 0; i < o.calls; i++ {
		key := o.key
		if o.keys > 0 {
			key = fmt.Sprintf("%s:%d", o.key, i%o.keys)
		}
		var r xcloak.Decision
		if o.peek {
			r, err = limiter.Peek(ctx, key, o.window, o.limit, opts...)
		} else {
			r, err = limiter.Allow(ctx, key, o.window, o.limit, opts...)
		}
		if err != nil {
			return fmt.Errorf("request %d (%s): %w", i, key, err)
		}
		fmt.Println(line(r, names))
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}
