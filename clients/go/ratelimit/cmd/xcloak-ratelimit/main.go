// Command xcloak-ratelimit is a drop-in rate limit service for Envoy that
// reads envoyproxy/ratelimit's configuration files and environment, and
// decides each limit with an exact sliding window in Redis (xcloak).
//
//	xcloak-ratelimit -config DIR -redis HOST:PORT
//
// serves gRPC on :8081 (GRPC_HOST, GRPC_PORT) and HTTP on :8080 (HOST,
// PORT: /healthcheck, /json, /metrics). The flags win over the environment.
// -check loads the configuration, prints what it found and exits: 0 when it
// loads, 1 with the file, the line and the reason when it does not.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/xcloak/xcloak/clients/go/ratelimit"
	"github.com/xcloak/xcloak/clients/go/ratelimit/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv))
}

func run(args []string, getenv func(string) string) int {
	fs := flag.NewFlagSet("xcloak-ratelimit", flag.ContinueOnError)
	configDir := fs.String("config", "", "the directory of envoyproxy/ratelimit YAML files (default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY)")
	redisAddr := fs.String("redis", "", "the Redis address, host:port (default $REDIS_URL, else 127.0.0.1:6379)")
	grpcAddr := fs.String("grpc", "", "the gRPC listen address (default $GRPC_HOST:$GRPC_PORT, else 0.0.0.0:8081)")
	httpAddr := fs.String("http", "", "the HTTP listen address (default $HOST:$PORT, else 0.0.0.0:8080)")
	check := fs.Bool("check", false, "load the configuration, print it and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	s, err := ratelimit.LoadSettings(getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "xcloak-ratelimit: %v\n", err)
		return 2
	}
	if *configDir != "" {
		s.ConfigDir = *configDir
	}
	if *redisAddr != "" {
		s.RedisURL = *redisAddr
	}
	if *grpcAddr != "" {
		s.GRPCAddr = *grpcAddr
	}
	if *httpAddr != "" {
		s.HTTPAddr = *httpAddr
	}
	if *check {
		c, err := config.LoadDir(s.ConfigDir, config.Options{MergeDomains: s.MergeDomains, MaxLimit: s.MaxLimit})
		if err != nil {
			fmt.Fprintf(os.Stderr, "xcloak-ratelimit: %v\n", err)
			return 1
		}
		fmt.Printf("%d files, %d limits, domains: %s\n", len(c.Files), c.Limits, strings.Join(c.Domains(), ", "))
		return 0
	}
	log := logger(s)
	log.Warn("xcloak-ratelimit starting", "grpc", s.GRPCAddr, "http", s.HTTPAddr, "config", s.ConfigDir,
		"redis", s.RedisURL, "redis_type", s.RedisType, "key_prefix", s.KeyPrefix, "on_error", s.OnError.String())
	if len(s.Ignored) > 0 {
		log.Warn("envoyproxy/ratelimit settings ignored here (no meaning for xcloak-ratelimit)", "variables", strings.Join(s.Ignored, ","))
	}
	rdb := s.RedisClient()
	defer rdb.Close()
	srv, err := ratelimit.NewServer(s, rdb, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "xcloak-ratelimit: configuration refused: %v\n", err)
		return 1
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "xcloak-ratelimit: %v\n", err)
		return 1
	}
	log.Warn("serving", "grpc", srv.GRPCAddr(), "http", srv.HTTPAddr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Warn("stopping: health checks fail from now, calls in flight finish")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Stop(ctx)
	return 0
}

func logger(s *ratelimit.Settings) *slog.Logger {
	level := slog.LevelWarn
	switch s.LogLevel {
	case "debug", "trace":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error", "fatal", "panic":
		level = slog.LevelError
	}
	opt := &slog.HandlerOptions{Level: level}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opt))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opt))
}
