// Command compare runs xcloak-ratelimit and envoyproxy/ratelimit side by
// side: the same Redis (with the xcloak module), the same configuration
// files, the same environment variables, and gRPC calls to each. It prints:
//
//   - the decisions of 15 calls inside one window at 10/minute (they must be
//     the same);
//   - over-admission at a window boundary: 10 calls in 200 ms across a second
//     boundary at 5/second (the reference's fixed window admits up to 10;
//     an exact sliding window 5);
//   - RLS calls per second and p50/p99 latency of each, in interleaved slices
//     of one run, and Redis CPU per call (INFO commandstats) beside the
//     module's own XCLOAK.ALLOW sent directly;
//   - Redis instructions per call (valgrind --tool=callgrind on a second
//     redis-server): per RLS call of each service and per direct call, the
//     repeatable measure of server CPU on a noisy machine.
//
// It exits 1 when a target fails: different decisions inside the window,
// any over-admission by xcloak-ratelimit, Redis instructions per RLS call
// above 1.3x the module's own call, or a p99 worse than the reference's.
//
//	go run ./compare -xcloak target/xcloak-ratelimit -reference ~/.cache/xcloak-ratelimit/ref/service_cmd -module target/release/libxcloak.so
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	rlsCommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const configYAML = `
domain: compare
descriptors:
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: boundary
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: load
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

func main() {
	xcloakBin := flag.String("xcloak", "target/xcloak-ratelimit", "the xcloak-ratelimit binary")
	refBin := flag.String("reference", "", "envoyproxy/ratelimit's service_cmd binary")
	module := flag.String("module", "target/release/libxcloak.so", "the xcloak module")
	calls := flag.Int("calls", 20000, "calls per service in the throughput run")
	conc := flag.Int("concurrency", 32, "concurrent callers in the throughput run")
	rounds := flag.Int("rounds", 3, "boundary runs and throughput rounds")
	instr := flag.Int("instructions", 2000, "calls per service with Redis under callgrind (0 skips it)")
	flag.Parse()
	if err := run(*xcloakBin, *refBin, *module, *calls, *conc, *rounds, *instr); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

type proc struct {
	cmd  *exec.Cmd
	name string
}

func (p *proc) stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_, _ = p.cmd.Process.Wait()
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// others are the CPUs the services run on ("" when not pinned).
var others string

type service struct {
	name   string
	proc   *proc
	client pb.RateLimitServiceClient
	conn   *grpc.ClientConn
}

func startService(name, bin, runtimeRoot, redisAddr, prefix string, logDir string) (*service, error) {
	grpcPort, httpPort, debugPort := freePort(), freePort(), freePort()
	cmd := exec.Command(bin)
	if others != "" {
		cmd = exec.Command("taskset", "-c", others, bin)
	}
	// The same variables for both: the reference's own, as a deployment sets them.
	cmd.Env = append(os.Environ(),
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "USE_STATSD=false", "LOG_LEVEL=warn",
		"RUNTIME_ROOT="+runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(grpcPort), "HOST=127.0.0.1", "PORT="+strconv.Itoa(httpPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(debugPort), "CACHE_KEY_PREFIX="+prefix,
		// The reference waits up to REDIS_TIMEOUT (10 s by default) for Redis; xcloak-ratelimit as long.
		"XCLOAK_TIMEOUT=10s",
	)
	logFile, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, name: name}
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", httpPort)
	if !waitFor(30*time.Second, func() bool {
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}) {
		p.stop()
		return nil, fmt.Errorf("%s never became healthy (log: %s)", name, logFile.Name())
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.stop()
		return nil, err
	}
	return &service{name: name, proc: p, client: pb.NewRateLimitServiceClient(conn), conn: conn}, nil
}

func (s *service) call(key, value string) (pb.RateLimitResponse_Code, uint32, time.Duration, error) {
	req := &pb.RateLimitRequest{Domain: "compare", Descriptors: []*rlsCommon.RateLimitDescriptor{
		{Entries: []*rlsCommon.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	resp, err := s.client.ShouldRateLimit(ctx, req)
	took := time.Since(t0)
	if err != nil {
		return 0, 0, took, err
	}
	return resp.OverallCode, resp.Statuses[0].LimitRemaining, took, nil
}

func commandUsec(rdb *redis.Client) (usec float64, calls int64) {
	info := rdb.Info(context.Background(), "commandstats").Val()
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		name, rest, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "cmdstat_info" || name == "cmdstat_config" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "usec":
				n, _ := strconv.ParseFloat(v, 64)
				usec += n
			case "calls":
				n, _ := strconv.ParseInt(v, 10, 64)
				if name != "cmdstat_ping" {
					calls += n
				}
			}
		}
	}
	return usec, calls
}

// cpuNs is the CPU time a process has run (every thread), from
// /proc/PID/task/*/schedstat: nanoseconds, not clock ticks.
func cpuNs(pid int) int64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var total int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(data))
		if len(fields) > 0 {
			n, _ := strconv.ParseInt(fields[0], 10, 64)
			total += n
		}
	}
	return total
}

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)]
}

func run(xcloakBin, refBin, module string, calls, conc, rounds, instrCalls int) error {
	if refBin == "" {
		return fmt.Errorf("-reference is required (scripts build it: make ratelimit-compare)")
	}
	work, err := os.MkdirTemp("", "xcloak-rls-compare")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	cfgDir := filepath.Join(work, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "compare.yaml"), []byte(configYAML), 0o644); err != nil {
		return err
	}
	redisPort := freePort()
	// Redis gets a core of its own (the last), the services and this program
	// the others: on a small machine the services' own CPU would otherwise
	// preempt Redis mid-call and inflate its CPU per call.
	redisArgs := []string{"redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", work, "--loadmodule", module}
	if n := runtime.NumCPU(); n >= 2 {
		if _, err := exec.LookPath("taskset"); err == nil {
			redisArgs = append([]string{"taskset", "-c", strconv.Itoa(n - 1)}, redisArgs...)
			others = fmt.Sprintf("0-%d", n-2)
		}
	}
	redisCmd := exec.Command(redisArgs[0], redisArgs[1:]...)
	if err := redisCmd.Start(); err != nil {
		return err
	}
	defer func() { _ = redisCmd.Process.Kill(); _, _ = redisCmd.Process.Wait() }()
	redisAddr := fmt.Sprintf("127.0.0.1:%d", redisPort)
	// The direct calls go through a client shaped as the service's own
	// (REDIS_POOL_SIZE, default 10): Redis CPU per call depends on how many
	// connections carry the calls (more connections, more calls per wake-up).
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 10})
	defer rdb.Close()
	if !waitFor(10*time.Second, func() bool { return rdb.Ping(context.Background()).Err() == nil }) {
		return fmt.Errorf("redis-server did not start")
	}
	xc, err := startService("xcloak-ratelimit", xcloakBin, filepath.Join(work, "runtime"), redisAddr, "xc:", work)
	if err != nil {
		return err
	}
	defer xc.proc.stop()
	ref, err := startService("envoyproxy-ratelimit", refBin, filepath.Join(work, "runtime"), redisAddr, "ref:", work)
	if err != nil {
		return err
	}
	defer ref.proc.stop()
	failed := []string{}

	// 1. Inside one window: the same decisions. Start early in a minute, so
	// the reference's fixed minute does not roll over during the calls.
	for time.Now().Second() > 45 {
		time.Sleep(100 * time.Millisecond)
	}
	var seq [2][]string
	for i, s := range []*service{xc, ref} {
		for n := 0; n < 15; n++ {
			code, remaining, _, err := s.call("window", "same")
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			seq[i] = append(seq[i], fmt.Sprintf("%s/%d", code, remaining))
		}
	}
	same := strings.Join(seq[0], " ") == strings.Join(seq[1], " ")
	fmt.Printf("## Inside one window (10/minute, 15 calls)\n\n| service | decisions (code/remaining) |\n|---|---|\n")
	fmt.Printf("| xcloak-ratelimit | %s |\n| envoyproxy/ratelimit | %s |\n\nsame decisions: %v\n\n", strings.Join(seq[0], " "), strings.Join(seq[1], " "), same)
	if !same {
		failed = append(failed, "the decisions inside one window differ")
	}

	// 2. Across a second boundary at 5/second: 10 calls, one every 20 ms, from
	// 100 ms before a boundary.
	fmt.Printf("## Across a window boundary (5/second, 10 calls in 200 ms around a second boundary)\n\n| run | xcloak-ratelimit admitted | envoyproxy/ratelimit admitted |\n|---|---|---|\n")
	for r := 0; r < rounds; r++ {
		admitted := [2]int{}
		var wg sync.WaitGroup
		now := time.Now()
		next := now.Truncate(time.Second).Add(time.Second)
		if next.Sub(now) < 300*time.Millisecond {
			next = next.Add(time.Second)
		}
		time.Sleep(time.Until(next.Add(-100 * time.Millisecond)))
		for i, s := range []*service{xc, ref} {
			wg.Add(1)
			go func(i int, s *service) {
				defer wg.Done()
				start := time.Now()
				for n := 0; n < 10; n++ {
					time.Sleep(time.Until(start.Add(time.Duration(n) * 20 * time.Millisecond)))
					if code, _, _, err := s.call("boundary", fmt.Sprintf("run%d", r)); err == nil && code == pb.RateLimitResponse_OK {
						admitted[i]++
					}
				}
			}(i, s)
		}
		wg.Wait()
		fmt.Printf("| %d | %d | %d |\n", r+1, admitted[0], admitted[1])
		if admitted[0] > 5 {
			failed = append(failed, fmt.Sprintf("xcloak-ratelimit admitted %d of 10 at 5/second", admitted[0]))
		}
		time.Sleep(1100 * time.Millisecond) // the windows of this run are empty again
	}

	// 3. Throughput, latency and Redis CPU per call. Each round is cut into
	// slices, and each slice runs the two services one after the other (in
	// turn first) and then the module's own call: a burst of load from
	// elsewhere on the machine falls on all three alike.
	const slices = 10
	fmt.Printf("\n## Throughput (%d calls per service, %d concurrent callers, 1,000 identities, %d rounds of %d interleaved slices, medians of rounds)\n\n", calls, conc, rounds, slices)
	type result struct {
		rps, p50, p99, usecPerCall float64
		redisCalls, cpuPerCall     float64
	}
	type tally struct {
		lat            []time.Duration
		elapsed        time.Duration
		usec, cpu      float64
		commands, sent int64
	}
	redisPid := redisCmd.Process.Pid
	measure := func(s *service, round, slice, n int, t *tally) error {
		rdb.ConfigResetStat(context.Background())
		var mu sync.Mutex
		var wg sync.WaitGroup
		var firstErr error
		per := n / conc
		cpu0 := cpuNs(redisPid)
		t0 := time.Now()
		for c := 0; c < conc; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				local := make([]time.Duration, 0, per)
				for i := 0; i < per; i++ {
					_, _, took, err := s.call("load", fmt.Sprintf("r%d-%d", round, (slice*n+c*per+i)%1000))
					if err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
					local = append(local, took)
				}
				mu.Lock()
				t.lat = append(t.lat, local...)
				mu.Unlock()
			}(c)
		}
		wg.Wait()
		t.elapsed += time.Since(t0)
		t.cpu += float64(cpuNs(redisPid)-cpu0) / 1000
		usec, cmds := commandUsec(rdb)
		t.usec += usec
		t.commands += cmds
		t.sent += int64(per * conc)
		return firstErr
	}
	// The module's own call, sent directly the way the service sends it: one
	// XCLOAK.ALLOW key window limit DETAILS STAMP per round trip, from as many
	// concurrent callers over as many connections, at the service's rate.
	direct := func(round, slice, n int, rate float64, t *tally) {
		rdb.ConfigResetStat(context.Background())
		var wg sync.WaitGroup
		cpu0 := cpuNs(redisPid)
		per := n / conc
		for c := 0; c < conc; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				// Paced to the service's own rate: Redis pays the cache misses
				// of a cold call when calls arrive one at a time, so a baseline
				// sent faster (more calls per wake-up) reads cheaper.
				interval := time.Duration(float64(conc) / rate * float64(time.Second))
				start := time.Now().Add(time.Duration(c) * interval / time.Duration(conc))
				for i := 0; i < per; i++ {
					time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
					rdb.Do(context.Background(), "XCLOAK.ALLOW", fmt.Sprintf("direct:r%d-%d", round, (slice*n+c*per+i)%1000), 3600000, 1000000, "DETAILS", "STAMP")
				}
			}(c)
		}
		wg.Wait()
		t.cpu += float64(cpuNs(redisPid)-cpu0) / 1000
		usec, cmds := commandUsec(rdb)
		t.usec += usec
		t.commands += cmds
		t.sent += int64(per * conc)
	}
	summarize := func(t *tally) result {
		n := float64(len(t.lat))
		if n == 0 {
			n = float64(t.sent)
		}
		r := result{usecPerCall: t.usec / n, redisCalls: float64(t.commands) / n, cpuPerCall: t.cpu / n}
		if len(t.lat) > 0 {
			r.rps = n / t.elapsed.Seconds()
			r.p50 = float64(percentile(t.lat, 0.5).Microseconds())
			r.p99 = float64(percentile(t.lat, 0.99).Microseconds())
		}
		return r
	}
	var xs, rs []result
	var ds, dcpu []float64
	for r := 0; r < rounds; r++ {
		var tx, tr, td tally
		per := calls / slices
		for sl := 0; sl < slices; sl++ {
			order := []*service{xc, ref}
			tallies := []*tally{&tx, &tr}
			if sl%2 == 1 {
				order, tallies = []*service{ref, xc}, []*tally{&tr, &tx}
			}
			for i, s := range order {
				if err := measure(s, r, sl, per, tallies[i]); err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
			}
			rate := float64(len(tx.lat)) / tx.elapsed.Seconds()
			direct(r, sl, per, rate, &td)
		}
		x, y, d := summarize(&tx), summarize(&tr), summarize(&td)
		xs, rs, ds, dcpu = append(xs, x), append(rs, y), append(ds, d.usecPerCall), append(dcpu, d.cpuPerCall)
	}
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	pick := func(rs []result, f func(result) float64) float64 {
		v := []float64{}
		for _, r := range rs {
			v = append(v, f(r))
		}
		return med(v)
	}
	ratios := []float64{}
	for i := range xs {
		ratios = append(ratios, xs[i].usecPerCall/ds[i])
	}
	fmt.Printf("| service | RLS calls/s | p50 | p99 | Redis commands per call | Redis CPU per call (commandstats) | redis-server process CPU per call |\n|---|---|---|---|---|---|---|\n")
	for _, row := range []struct {
		name string
		rs   []result
	}{{"xcloak-ratelimit", xs}, {"envoyproxy/ratelimit", rs}} {
		fmt.Printf("| %s | %.0f | %.0f us | %.0f us | %.2f | %.2f us | %.1f us |\n", row.name,
			pick(row.rs, func(r result) float64 { return r.rps }), pick(row.rs, func(r result) float64 { return r.p50 }),
			pick(row.rs, func(r result) float64 { return r.p99 }), pick(row.rs, func(r result) float64 { return r.redisCalls }),
			pick(row.rs, func(r result) float64 { return r.usecPerCall }), pick(row.rs, func(r result) float64 { return r.cpuPerCall }))
	}
	fmt.Printf("| XCLOAK.ALLOW sent directly, at xcloak-ratelimit's rate | | | | 1.00 | %.2f us | %.1f us |\n", med(ds), med(dcpu))
	fmt.Printf("\nRedis CPU per RLS call / the module's own call (INFO commandstats usec per call, medians of per-round ratios): %.2fx (timed: noisy; the target is judged on instructions below)\n", med(ratios))
	fmt.Printf("The process CPU (/proc schedstat) adds the event loop's reads and writes: per call it depends on how many calls arrive together, not on the command.\n")
	xp99, rp99 := pick(xs, func(r result) float64 { return r.p99 }), pick(rs, func(r result) float64 { return r.p99 })
	fmt.Printf("p99: xcloak-ratelimit %.0f us, envoyproxy/ratelimit %.0f us (target: no worse)\n", xp99, rp99)
	if xp99 > rp99 {
		failed = append(failed, fmt.Sprintf("p99 %.0f us above the reference's %.0f us", xp99, rp99))
	}

	// 4. Redis instructions per call under callgrind: the repeatable measure.
	if instrCalls > 0 {
		if err := instructions(xcloakBin, refBin, module, work, instrCalls, &failed); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("FAIL: %s", strings.Join(failed, "; "))
	}
	fmt.Println("\nPASS: every target")
	return nil
}

// instructions runs a second redis-server under callgrind, with a service of
// each kind on it, and counts the server's instructions per call: whole
// program (the event loop's reads, parsing and replies included) and inside
// call() (the command itself), for N RLS calls of each service and N direct
// XCLOAK.ALLOW calls, one caller at a time, each on a new identity.
func instructions(xcloakBin, refBin, module, work string, n int, failed *[]string) error {
	if _, err := exec.LookPath("valgrind"); err != nil {
		return fmt.Errorf("valgrind is needed for -instructions (0 skips it): %w", err)
	}
	dir, err := os.MkdirTemp(work, "callgrind")
	if err != nil {
		return err
	}
	port := freePort()
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+dir+"/cg.out",
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--loadmodule", module)
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// Valgrind takes seconds to start the server: wait for its port before a
	// client dials (go-redis logs each refused dial).
	if !waitFor(60*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		return fmt.Errorf("redis-server under callgrind did not listen on %s", addr)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer rdb.Close()
	if !waitFor(60*time.Second, func() bool { return rdb.Ping(context.Background()).Err() == nil }) {
		return fmt.Errorf("redis-server under callgrind did not start")
	}
	xc, err := startService("xcloak-ratelimit-cg", xcloakBin, filepath.Join(work, "runtime"), addr, "xc:", dir)
	if err != nil {
		return err
	}
	defer xc.proc.stop()
	ref, err := startService("envoyproxy-ratelimit-cg", refBin, filepath.Join(work, "runtime"), addr, "ref:", dir)
	if err != nil {
		return err
	}
	defer ref.proc.stop()
	pid := strconv.Itoa(cmd.Process.Pid)
	dumps := 0
	phase := func(tag string, send func(i int) error) (total, inCall float64, err error) {
		// Warm: the first calls load code and grow tables.
		for i := 0; i < 50; i++ {
			if err := send(-1 - i); err != nil {
				return 0, 0, err
			}
		}
		if out, err := exec.Command("callgrind_control", "-z", pid).CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("callgrind_control -z: %v: %s", err, out)
		}
		for i := 0; i < n; i++ {
			if err := send(i); err != nil {
				return 0, 0, err
			}
		}
		if out, err := exec.Command("callgrind_control", "-d", tag, pid).CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("callgrind_control -d: %v: %s", err, out)
		}
		dumps++
		file := fmt.Sprintf("%s/cg.out.%d", dir, dumps)
		if !waitFor(120*time.Second, func() bool { _, err := os.Stat(file); return err == nil }) {
			return 0, 0, fmt.Errorf("no callgrind dump %s", file)
		}
		// The dump is written asynchronously: wait until its size settles.
		last := int64(-1)
		waitFor(30*time.Second, func() bool {
			st, err := os.Stat(file)
			if err != nil {
				return false
			}
			settled := st.Size() == last && st.Size() > 0
			last = st.Size()
			time.Sleep(200 * time.Millisecond)
			return settled
		})
		out, err := exec.Command("callgrind_annotate", "--inclusive=yes", "--threshold=100", file).Output()
		if err != nil {
			return 0, 0, fmt.Errorf("callgrind_annotate: %w", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			fields := strings.Fields(line)
			if len(fields) < 2 {
				continue
			}
			value, perr := strconv.ParseFloat(strings.ReplaceAll(fields[0], ",", ""), 64)
			if perr != nil {
				continue
			}
			switch {
			case strings.HasSuffix(line, "PROGRAM TOTALS"):
				total = value
			case inCall == 0 && isCall(fields[1:]):
				inCall = value
			}
		}
		if total == 0 {
			return 0, 0, fmt.Errorf("no totals in %s", file)
		}
		return total / float64(n), inCall / float64(n), nil
	}
	rls := func(s *service) func(i int) error {
		return func(i int) error {
			_, _, _, err := s.call("load", fmt.Sprintf("cg-%d", i))
			return err
		}
	}
	xt, xcall, err := phase("xcloak", rls(xc))
	if err != nil {
		return err
	}
	rt, rcall, err := phase("reference", rls(ref))
	if err != nil {
		return err
	}
	dt, dcall, err := phase("direct", func(i int) error {
		return rdb.Do(context.Background(), "XCLOAK.ALLOW", fmt.Sprintf("direct:cg-%d", i), 3600000, 1000000, "DETAILS", "STAMP").Err()
	})
	if err != nil {
		return err
	}
	fmt.Printf("\n## Redis instructions per call (callgrind, %d calls each, one caller, a new identity per call)\n\n", n)
	fmt.Printf("| calls | whole server | the command (call()) |\n|---|---|---|\n")
	fmt.Printf("| xcloak-ratelimit (one RLS call) | %.0f | %.0f |\n", xt, xcall)
	fmt.Printf("| envoyproxy/ratelimit (one RLS call) | %.0f | %.0f |\n", rt, rcall)
	fmt.Printf("| XCLOAK.ALLOW sent directly | %.0f | %.0f |\n", dt, dcall)
	ratio := xt / dt
	fmt.Printf("\nRedis instructions per RLS call / the module's own call (whole server): %.2fx (target <= 1.3x); the command alone: %.2fx\n", ratio, xcall/dcall)
	if ratio > 1.3 {
		*failed = append(*failed, fmt.Sprintf("Redis instructions per RLS call are %.2fx the module's own call", ratio))
	}
	return nil
}

// isCall tells whether callgrind_annotate's name columns are Redis' call().
func isCall(names []string) bool {
	for _, f := range names {
		if f == "call" || strings.HasSuffix(f, ":call") {
			return true
		}
	}
	return false
}
