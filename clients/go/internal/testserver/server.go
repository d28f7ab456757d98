// Package testserver starts the real servers the tests run against: redis-server
// processes on loopback, with the module or without it, as standalone
// servers, primaries with replicas, Redis Cluster and Sentinel. It is the Go
// counterpart of the repository's tests/common, with the same conventions:
//
//   - server binary: $XCLOAK_SERVER, else redis-server on PATH; Sentinel:
//     $XCLOAK_SENTINEL, else redis-sentinel; redis-cli: $XCLOAK_REDIS_CLI;
//   - module: $XCLOAK_MODULE, else target/release/libxcloak.so of the checkout
//     ($XCLOAK_REPO, else found from this file);
//   - ports from the Go package's slice, 21000..21999, each checked free with
//     its cluster bus port (+10000, below Linux's ephemeral range);
//   - every server is stopped when its test ends, even on failure.
package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	firstPort = 21000
	lastPort  = 21999
)

var nextPort atomic.Int32

// FreePort is a loopback port of the Go slice whose bus port (+10000) is
// free too. Each process starts at an offset of its own.
func FreePort() int {
	nextPort.CompareAndSwap(0, int32(firstPort+(os.Getpid()%20)*50))
	for {
		p := int(nextPort.Add(1))
		if p > lastPort {
			nextPort.Store(firstPort)
			continue
		}
		if free(p) && free(p+10000) {
			return p
		}
	}
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Repo is the checkout's root: $XCLOAK_REPO, else found from this file.
func Repo() string {
	if r := os.Getenv("XCLOAK_REPO"); r != "" {
		return r
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "../../../..")
}

// Module is the module's path ($XCLOAK_MODULE, else the release build).
func Module() string {
	if m := os.Getenv("XCLOAK_MODULE"); m != "" {
		return m
	}
	return filepath.Join(Repo(), "target/release/libxcloak.so")
}

func binary(env, fallback string) string {
	if b := os.Getenv(env); b != "" {
		return b
	}
	return fallback
}

// Config is how to start a server.
type Config struct {
	NoModule bool     // start without --loadmodule (the Lua fallback answers)
	Args     []string // extra options: "--name", "value", ...
	sentinel bool
}

// Server is one running server process.
type Server struct {
	Port   int
	Dir    string
	config Config
	t      testing.TB
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts a server (with the module unless cfg.NoModule) and stops it
// when t ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if !cfg.NoModule && !cfg.sentinel {
		if _, err := os.Stat(Module()); err != nil {
			t.Fatalf("module not built at %s (run `make build`, or set XCLOAK_MODULE)", Module())
		}
	}
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{Port: FreePort(), config: cfg, t: t}
		s.Dir = t.TempDir()
		if s.launch() {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatal("no free port after 5 attempts")
	return nil
}

func (s *Server) args() []string {
	args := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--logfile", "server.log", "--save", "", "--appendonly", "no", "--protected-mode", "no",
	}
	if s.config.sentinel {
		return append([]string{filepath.Join(s.Dir, "sentinel.conf"), "--port", strconv.Itoa(s.Port),
			"--bind", "127.0.0.1", "--dir", s.Dir, "--logfile", "server.log", "--protected-mode", "no"}, s.config.Args...)
	}
	if !s.config.NoModule {
		args = append(args, "--loadmodule", Module())
	}
	return append(args, s.config.Args...)
}

// launch starts the process; false when another process's server took the port.
func (s *Server) launch() bool {
	bin := binary("XCLOAK_SERVER", "redis-server")
	if s.config.sentinel {
		bin = binary("XCLOAK_SENTINEL", "redis-sentinel")
	}
	cmd := exec.Command(bin, s.args()...)
	cmd.Dir = s.Dir
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("cannot start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			if strings.Contains(s.Log(), "Address already in use") {
				return false
			}
			s.t.Fatalf("server on %d exited:\n%s", s.Port, s.Log())
		default:
		}
		if pid, err := s.pid(); err == nil {
			if pid == cmd.Process.Pid {
				return true
			}
			s.Kill() // someone else's server answers on our port
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("server on %d not ready:\n%s", s.Port, s.Log())
	return false
}

func (s *Server) pid() (int, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(Field(info, "process_id"))
}

// Addr is 127.0.0.1:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is redis://127.0.0.1:port/.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/" }

// Log is the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	return string(b)
}

// Client is a plain go-redis client on this server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Do runs one command on a fresh connection and fails the test on an error.
func (s *Server) Do(args ...interface{}) interface{} {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		s.t.Fatalf("%v on %d: %v", args, s.Port, err)
	}
	return v
}

// Info is INFO section.
func (s *Server) Info(section string) string {
	return s.Do("INFO", section).(string)
}

// Stat is a counter of INFO section: Stat("commandstats",
// "cmdstat_xcloak.allow", "calls"), Stat("errorstats", "errorstat_MOVED",
// "count"); 0 when absent.
func (s *Server) Stat(section, line, field string) int64 {
	for _, l := range strings.Split(s.Info(section), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || name != line {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if k, v, _ := strings.Cut(kv, "="); k == field {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
	}
	return 0
}

// Calls is how many times the server ran a command (INFO commandstats).
func (s *Server) Calls(command string) int64 {
	return s.Stat("commandstats", "cmdstat_"+strings.ToLower(command), "calls")
}

// ResetStats is CONFIG RESETSTAT.
func (s *Server) ResetStats() { s.Do("CONFIG", "RESETSTAT") }

// Pause stops the process (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Kill stops the process at once (SIGKILL) and waits for it.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts the server again on its port, directory and options.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	if !s.launch() {
		s.t.Fatalf("port %d was taken while the server was down", s.Port)
	}
}

// Field is the value of "name:value" in an INFO reply.
func Field(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return ""
}

// IsRole reports whether the server's INFO replication says role:role
// ("master" or "slave"); false when it does not answer.
func IsRole(s *Server, role string) bool {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	return err == nil && Field(info, "role") == role
}

// Eventually polls cond every 20 ms until it holds or d passes.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Version is the server binary's major, minor (from --version).
func Version() (int, int) {
	out, _ := exec.Command(binary("XCLOAK_SERVER", "redis-server"), "--version").Output()
	for _, w := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(w, "v="); ok {
			var major, minor int
			fmt.Sscanf(v, "%d.%d", &major, &minor)
			return major, minor
		}
	}
	return 0, 0
}

// CommandStat is one command's line of INFO commandstats.
type CommandStat struct {
	Calls int64
	Usec  int64 // server CPU, microseconds
}

// CommandStats is INFO commandstats by command ("xcloak.allow",
// "client|setinfo"), without the commands a client sends to set up a
// connection (HELLO, CLIENT SETINFO...) nor the test's own INFO and CONFIG.
func (s *Server) CommandStats() map[string]CommandStat {
	out := map[string]CommandStat{}
	for _, l := range strings.Split(s.Info("commandstats"), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		command, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat {
			continue
		}
		switch strings.SplitN(command, "|", 2)[0] {
		case "hello", "client", "info", "config", "select", "auth", "ping":
			continue
		}
		var st CommandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			}
		}
		out[command] = st
	}
	return out
}
