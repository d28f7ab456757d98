// Benchmarks of the xcloak Go package, as ratios taken in one run on one
// server (the machines are shared and noisy: only ratios mean anything).
//
//	cd clients/go/bench && go test -bench . -benchtime 20000x
//
// BenchmarkOverhead: Limiter.Allow against a raw rdb.Do of the same
// command, the two interleaved call by call. BenchmarkServerCost: server
// CPU per call (INFO commandstats usec_per_call) of XCLOAK.ALLOW, of the
// bundled script, and of go-redis/redis_rate's Allow (GCRA in Lua);
// memory per identity (MEMORY USAGE, windows filled to the limit), with
// xcloak's windows as sorted sets and in the compact form.
package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

const identities = 1000

// BenchmarkOverhead: per call, Limiter.Allow (reply parsed into a Decision,
// NoRetry, the Limiter's timeout) against rdb.Do of the same XCLOAK.ALLOW
// ... DETAILS, in alternating blocks of 100 calls. Reported: wall ns per
// call of each and their ratio, and the client's CPU (this process's
// user+system time, rusage) per call of each and their ratio: wall time
// on a shared machine is mostly the scheduler's, CPU time is the client's
// own work. "default" is go-redis's default client (the Limiter bounds the
// call from a goroutine of its own); "context" a client with
// ContextTimeoutEnabled (the call is made directly).
func BenchmarkOverhead(b *testing.B) {
	server := testserver.Start(b, testserver.Config{})
	for _, c := range []struct {
		name string
		opt  redis.Options
	}{
		{"default", redis.Options{}},
		{"context", redis.Options{ContextTimeoutEnabled: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			opt := c.opt
			opt.Addr = server.Addr()
			rdb := redis.NewClient(&opt)
			defer rdb.Close()
			l, err := xcloak.NewLimiter(rdb, xcloak.Options{Fallback: xcloak.FallbackNever})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			server.Do("FLUSHALL")
			var wall, cpu [2]time.Duration // 0: raw, 1: limiter
			calls := [2]int{}
			const block = 100
			b.ResetTimer()
			for i := 0; i < b.N; i += block {
				for which := 0; which < 2; which++ {
					which := (which + i/block) % 2 // alternate which goes first
					n := min(block, b.N-i)
					cpuStart, start := cpuTime(), time.Now()
					for j := 0; j < n; j++ {
						id := strconv.Itoa((i + j) % identities)
						var err error
						if which == 0 {
							err = rdb.Do(ctx, "XCLOAK.ALLOW", "raw:"+id, 60000, 1000000, "DETAILS").Err()
						} else {
							_, err = l.Allow(ctx, "lim:"+id, time.Minute, 1000000)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					wall[which] += time.Since(start)
					cpu[which] += cpuTime() - cpuStart
					calls[which] += n
				}
			}
			b.ReportMetric(float64(wall[1].Nanoseconds())/float64(calls[1]), "limiter-ns/call")
			b.ReportMetric(float64(wall[0].Nanoseconds())/float64(calls[0]), "raw-ns/call")
			b.ReportMetric(float64(wall[1])/float64(wall[0]), "ratio")
			b.ReportMetric(float64(cpu[1].Nanoseconds())/float64(calls[1]), "limiter-cpu-ns/call")
			b.ReportMetric(float64(cpu[0].Nanoseconds())/float64(calls[0]), "raw-cpu-ns/call")
			b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "cpu-ratio")
		})
	}
}

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// usecPerCall is INFO commandstats' usec_per_call of a command.
func usecPerCall(s *testserver.Server, command string) float64 {
	for _, line := range strings.Split(s.Info("commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
					f, _ := strconv.ParseFloat(v, 64)
					return f
				}
			}
		}
	}
	return 0
}

// BenchmarkServerCost: the server's CPU per call and memory per identity of
// XCLOAK.ALLOW, of the bundled script (a server without the module) and of
// redis_rate's Allow (GCRA, EVALSHA of its script), on the same kind of
// server, with limit per minute and the windows filled to the limit.
func BenchmarkServerCost(b *testing.B) {
	withModule := testserver.Start(b, testserver.Config{})
	// Module arguments follow --loadmodule's path: the compact form.
	compact := testserver.Start(b, testserver.Config{Args: []string{"STORAGE", "compact"}})
	without := testserver.Start(b, testserver.Config{NoModule: true})
	ctx := context.Background()
	for _, limit := range []int{10, 100} {
		type contender struct {
			name    string
			server  *testserver.Server
			command string // in INFO commandstats
			key     func(id string) string
		}
		contenders := []contender{
			{"xcloak-command", withModule, "xcloak.allow", func(id string) string { return "rl:" + id }},
			{"xcloak-compact", compact, "xcloak.allow", func(id string) string { return "rl:" + id }},
			{"xcloak-script", without, "evalsha", func(id string) string { return "rl:" + id }},
			{"redis_rate", withModule, "evalsha", func(id string) string { return "rate:" + id }},
		}
		for _, c := range contenders {
			b.Run(fmt.Sprintf("%s/limit-%d", c.name, limit), func(b *testing.B) {
				rdb := redis.NewClient(&redis.Options{Addr: c.server.Addr()})
				defer rdb.Close()
				allow := func(id string) error {
					switch c.name {
					case "redis_rate":
						_, err := redis_rate.NewLimiter(rdb).Allow(ctx, id, redis_rate.PerMinute(limit))
						return err
					default: // xcloak-command, xcloak-compact, xcloak-script
						fallback := xcloak.FallbackNever
						if c.name == "xcloak-script" {
							fallback = xcloak.FallbackAlways
						}
						l, err := xcloak.NewLimiter(rdb, xcloak.Options{Fallback: fallback, Prefix: "rl:"})
						if err != nil {
							return err
						}
						_, err = l.Allow(ctx, id, time.Minute, limit)
						return err
					}
				}
				c.server.Do("FLUSHALL")
				allow("warm") // the script loaded, the connection made
				c.server.ResetStats()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := allow(strconv.Itoa(i % identities)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(usecPerCall(c.server, c.command), "server-usec/call")
				// Memory: identities filled to the limit (a minute's worth).
				c.server.Do("FLUSHALL")
				const filled = 200
				for id := 0; id < filled; id++ {
					for n := 0; n < limit; n++ {
						if err := allow("m" + strconv.Itoa(id)); err != nil {
							b.Fatal(err)
						}
					}
				}
				var bytes int64
				for id := 0; id < filled; id++ {
					n, err := rdb.MemoryUsage(ctx, c.key("m"+strconv.Itoa(id))).Result()
					if err != nil {
						b.Fatal(err)
					}
					bytes += n
				}
				b.ReportMetric(float64(bytes)/filled, "bytes/identity")
			})
		}
	}
}
