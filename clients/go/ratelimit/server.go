package ratelimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	xcloak "github.com/xcloak/xcloak/clients/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xcloak/xcloak/clients/go/ratelimit/config"
)

// Server is the running service: gRPC (RateLimitService and grpc.health.v1),
// HTTP (/healthcheck, /json, /metrics) and the configuration watcher.
type Server struct {
	Settings *Settings
	Service  *Service
	Log      *slog.Logger

	grpc        *grpc.Server
	health      *health.Server
	httpSrv     []*http.Server
	grpcLn      net.Listener
	httpLn      []net.Listener
	fingerprint [32]byte
	stopping    atomic.Bool
	healthMu    sync.Mutex // a status is read and set as one step (a reload racing Stop)
	wg          sync.WaitGroup
	cancel      context.CancelFunc
}

// NewServer builds the service of the settings on rdb and loads the
// configuration directory: a configuration that can't be loaded refuses
// the start, with the file, the line and the reason.
func NewServer(s *Settings, rdb redis.UniversalClient, log *slog.Logger) (*Server, error) {
	if s.ConfigDir == "" {
		return nil, &SettingError{"-config", "no configuration directory: pass -config DIR or set RUNTIME_ROOT (and RUNTIME_SUBDIRECTORY)"}
	}
	metrics := NewMetrics()
	metrics.MaxKeys = s.MaxStatsKeys
	limiter, err := xcloak.NewLimiter(rdb, s.LimiterOptions())
	if err != nil {
		return nil, err
	}
	srv := &Server{Settings: s, Service: NewService(limiter, metrics, s.ServiceOptions()), Log: log}
	if err := srv.reload(true); err != nil {
		return nil, err
	}
	return srv, nil
}

// reload reads the configuration directory and loads it if it changed
// since the last load; a bad file keeps the last good configuration. The
// files are read once, so what is loaded is what was compared.
func (srv *Server) reload(first bool) error {
	files, err := config.ReadDir(srv.Settings.ConfigDir)
	if err != nil {
		if first {
			return err
		}
		// A file removed between the listing and its reading: the next
		// poll sees the directory as it settled.
		srv.Log.Warn("configuration directory not read; the last good configuration keeps serving", "error", err.Error())
		return err
	}
	fp := fingerprint(files)
	if !first && fp == srv.fingerprint {
		return nil
	}
	srv.fingerprint = fp
	c, err := config.Parse(files, config.Options{MergeDomains: srv.Settings.MergeDomains, MaxLimit: srv.Settings.MaxLimit})
	if err != nil {
		srv.Service.Metrics().ConfigLoadError.Add(1)
		if !first {
			srv.Log.Error("configuration refused; the last good configuration keeps serving", "error", err.Error())
		}
		return err
	}
	srv.Service.SetConfig(c)
	srv.Service.Metrics().ConfigLoadSuccess.Add(1)
	srv.Log.Info("configuration loaded", "files", len(c.Files), "domains", strings.Join(c.Domains(), ","), "limits", c.Limits)
	srv.setHealth()
	return nil
}

// fingerprint hashes the names and contents of the configuration files, so
// a change is seen whatever the file system's clock resolution.
func fingerprint(files map[string][]byte) [32]byte {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, name := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(files[name]))
		h.Write(files[name])
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func (srv *Server) healthy() bool {
	if srv.stopping.Load() {
		return false
	}
	if srv.Settings.HealthyWithConfig {
		c := srv.Service.Config()
		return c != nil && len(c.Domains()) > 0
	}
	return true
}

func (srv *Server) setHealth() {
	if srv.health == nil {
		return
	}
	srv.healthMu.Lock()
	defer srv.healthMu.Unlock()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if srv.healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	srv.health.SetServingStatus("", st)
	srv.health.SetServingStatus(pb.RateLimitService_ServiceDesc.ServiceName, st)
}

// Start listens and serves in the background.
func (srv *Server) Start() error {
	s := srv.Settings
	var err error
	if s.GRPCUDS != "" {
		srv.grpcLn, err = net.Listen("unix", s.GRPCUDS)
	} else {
		srv.grpcLn, err = net.Listen("tcp", s.GRPCAddr)
	}
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	// Connections are closed after GRPC_MAX_CONNECTION_AGE (as the reference
	// does, 24 h by default), so Envoy's connections spread over new replicas.
	srv.grpc = grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: s.GRPCMaxConnectionAge, MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace,
	}))
	pb.RegisterRateLimitServiceServer(srv.grpc, srv.Service)
	srv.health = health.NewServer()
	healthpb.RegisterHealthServer(srv.grpc, srv.health)
	srv.setHealth()

	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", srv.serveHealth)
	mux.HandleFunc("/json", srv.serveJSON)
	mux.HandleFunc("/metrics", srv.serveMetrics)
	if err := srv.listenHTTP(s.HTTPAddr, mux); err != nil {
		return err
	}
	if s.PrometheusAddr != "" && s.PrometheusAddr != s.HTTPAddr {
		pm := http.NewServeMux()
		pm.HandleFunc(s.PrometheusPath, srv.serveMetrics)
		if err := srv.listenHTTP(s.PrometheusAddr, pm); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv.cancel = cancel
	srv.wg.Add(2)
	go func() {
		defer srv.wg.Done()
		if err := srv.grpc.Serve(srv.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			srv.Log.Error("gRPC server stopped", "error", err.Error())
		}
	}()
	go func() {
		defer srv.wg.Done()
		t := time.NewTicker(s.ReloadInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = srv.reload(false)
			}
		}
	}()
	return nil
}

func (srv *Server) listenHTTP(addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("HTTP listener %s: %w", addr, err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	srv.httpLn, srv.httpSrv = append(srv.httpLn, ln), append(srv.httpSrv, hs)
	srv.wg.Add(1)
	go func() {
		defer srv.wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.Log.Error("HTTP server stopped", "error", err.Error())
		}
	}()
	return nil
}

// GRPCAddr and HTTPAddr are the addresses listened on (a port 0 resolved).
func (srv *Server) GRPCAddr() string { return srv.grpcLn.Addr().String() }
func (srv *Server) HTTPAddr() string { return srv.httpLn[0].Addr().String() }

// Stop turns the health checks to failing, lets calls in flight finish
// (within ctx) and stops.
func (srv *Server) Stop(ctx context.Context) {
	srv.stopping.Store(true)
	srv.setHealth()
	if srv.cancel != nil {
		srv.cancel()
	}
	done := make(chan struct{})
	go func() { srv.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		srv.grpc.Stop()
	}
	for _, hs := range srv.httpSrv {
		_ = hs.Shutdown(ctx)
	}
	srv.wg.Wait()
}

func (srv *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if !srv.healthy() {
		http.Error(w, "NOT OK", http.StatusInternalServerError)
		return
	}
	_, _ = io.WriteString(w, "OK")
}

// serveJSON is the reference's /json: a RateLimitRequest in proto3 JSON,
// answered 200 (OK) or 429 (OVER_LIMIT) with the RateLimitResponse.
func (srv *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a RateLimitRequest in JSON", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := srv.Service.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		if st, ok := grpcStatus(err); ok {
			code = st
		}
		http.Error(w, err.Error(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

func (srv *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	srv.Service.Metrics().WritePrometheus(w)
	// The block cache (XCLOAK_BLOCK_CACHE): the calls it answered without
	// Redis, and the keys it holds.
	st := srv.Service.limiter.Stats()
	fmt.Fprintf(w, "# TYPE xcloak_block_cache_hits counter\nxcloak_block_cache_hits %d\n", st.CacheHits)
	fmt.Fprintf(w, "# TYPE xcloak_block_cache_entries gauge\nxcloak_block_cache_entries %d\n", st.CacheEntries)
}

// grpcStatus maps a ShouldRateLimit error to an HTTP status for /json.
func grpcStatus(err error) (int, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	switch st.Code() {
	case codes.InvalidArgument:
		return http.StatusBadRequest, true
	case codes.Unavailable, codes.DeadlineExceeded:
		return http.StatusServiceUnavailable, true
	}
	return http.StatusInternalServerError, true
}
