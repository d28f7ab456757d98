package ratelimit_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsCommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
	"github.com/xcloak/xcloak/clients/go/ratelimit"
)

// service is one xcloak-ratelimit started in the test's process on real
// listeners, over a real Redis, with a gRPC client connected to it.
type service struct {
	t      *testing.T
	srv    *ratelimit.Server
	client pb.RateLimitServiceClient
	dir    string
	redis  redis.UniversalClient
}

// start writes files into a fresh configuration directory and starts the
// service on redisAddr (REDIS_URL; REDIS_TYPE etc. from env).
func start(t *testing.T, redisURL string, files map[string]string, env map[string]string) *service {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vars := map[string]string{
		"REDIS_URL": redisURL, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
		"XCLOAK_RELOAD_INTERVAL": "50ms",
	}
	for k, v := range env {
		vars[k] = v
	}
	s, err := ratelimit.LoadSettings(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	s.ConfigDir = dir
	rdb := s.RedisClient()
	srv, err := ratelimit.NewServer(s, rdb, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
		rdb.Close()
	})
	return &service{t: t, srv: srv, client: pb.NewRateLimitServiceClient(conn), dir: dir, redis: rdb}
}

// d is a descriptor from "key=value" pairs ("key" alone: an empty value).
func d(pairs ...string) *rlsCommon.RateLimitDescriptor {
	out := &rlsCommon.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		out.Entries = append(out.Entries, &rlsCommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return out
}

// hits sets a descriptor's own hits_addend.
func hits(desc *rlsCommon.RateLimitDescriptor, n uint64) *rlsCommon.RateLimitDescriptor {
	desc.HitsAddend = wrapperspb.UInt64(n)
	return desc
}

func (s *service) call(domain string, descriptors ...*rlsCommon.RateLimitDescriptor) *pb.RateLimitResponse {
	s.t.Helper()
	resp, err := s.try(&pb.RateLimitRequest{Domain: domain, Descriptors: descriptors})
	if err != nil {
		s.t.Fatalf("ShouldRateLimit(%s): %v", domain, err)
	}
	return resp
}

func (s *service) try(req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.client.ShouldRateLimit(ctx, req)
}

// write replaces a configuration file (atomically, as a ConfigMap update does).
func (s *service) write(name, text string) {
	s.t.Helper()
	tmp := filepath.Join(s.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		s.t.Fatal(err)
	}
}

// backends are the servers every behaviour is checked on: the module, and a
// server without it (the Lua fallback answers).
func backends(t *testing.T) map[string]*testserver.Server {
	return map[string]*testserver.Server{
		"module":   testserver.Start(t, testserver.Config{}),
		"fallback": testserver.Start(t, testserver.Config{NoModule: true}),
	}
}

type rlsCommonDescriptor = rlsCommon.RateLimitDescriptor
type rlsCommonOverride = rlsCommon.RateLimitDescriptor_RateLimitOverride

const (
	rlsCommonUnitMinute = typev3.RateLimitUnit_MINUTE
	rlsCommonUnitSecond = typev3.RateLimitUnit_SECOND
)

func stringsContains(s, sub string) bool { return strings.Contains(s, sub) }
