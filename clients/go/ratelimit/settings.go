package ratelimit

import (
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	xcloak "github.com/xcloak/xcloak/clients/go"

	"github.com/xcloak/xcloak/clients/go/ratelimit/config"
)

// Settings are the service's configuration: envoyproxy/ratelimit's
// environment variables where they mean the same thing, xcloak's own
// (XCLOAK_*), and the command line's flags over both.
type Settings struct {
	ConfigDir      string
	ReloadInterval time.Duration
	MergeDomains   bool
	MaxLimit       uint32

	GRPCAddr string // host:port
	GRPCUDS  string // a unix socket instead
	// GRPCMaxConnectionAge closes a gRPC connection after this long (after
	// GRPCMaxConnectionAgeGrace for its calls to end): GRPC_MAX_CONNECTION_AGE.
	GRPCMaxConnectionAge, GRPCMaxConnectionAgeGrace time.Duration
	HTTPAddr                                        string
	// PrometheusAddr, when set and not the HTTP address, serves /metrics too.
	PrometheusAddr, PrometheusPath string

	RedisType         string // SINGLE, CLUSTER or SENTINEL
	RedisSocketType   string // tcp or unix
	RedisURL          string
	RedisAuth         string
	RedisSentinelAuth string
	RedisTLS          bool
	RedisPoolSize     int
	RedisDialTimeout  time.Duration

	KeyPrefix         string
	NearLimitRatio    float64
	GlobalShadowMode  bool
	HealthyWithConfig bool
	Headers           HeaderOptions

	OnError  xcloak.ErrorPolicy
	Timeout  time.Duration
	Fallback xcloak.Fallback
	Durable  *xcloak.Durable

	LogLevel, LogFormat string
	// MaxStatsKeys bounds the limits' counters (XCLOAK_MAX_STATS_KEYS).
	MaxStatsKeys int
	// BlockCache is the most keys the Limiter's block cache holds
	// (XCLOAK_BLOCK_CACHE, default 10,000; 0: no block cache).
	BlockCache int

	// Ignored lists the reference's variables set in the environment that
	// this service does not honour (said at startup).
	Ignored []string
}

// ignorable are the reference's variables that have no meaning here (statsd,
// memcached, the per-second Redis, TLS of the gRPC server, tracing, xDS...).
var ignorable = []string{
	"DEBUG_HOST", "DEBUG_PORT",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"FORCE_START_WITHOUT_INITIAL_CONFIG", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS",
	"STATS_FLUSH_INTERVAL", "DISABLE_STATS", "PROMETHEUS_MAPPER_YAML", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	"EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
	"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH",
	"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_PERSECOND_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL",
	"REDIS_STARTUP_MAX_ELAPSED_TIME", "MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV",
	"MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA",
	"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
	"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
	"XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	// The directory is compared by contents (a symlink swap included) and
	// names starting with a dot are always skipped.
	"RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES",
}

// defaultRuntimeRoot is the reference's RUNTIME_ROOT default.
const defaultRuntimeRoot = "/srv/runtime_data/current"

// SettingError is a setting the service refuses to start with.
type SettingError struct{ Name, Reason string }

func (e *SettingError) Error() string { return fmt.Sprintf("%s: %s", e.Name, e.Reason) }

// LoadSettings reads the environment (getenv, e.g. os.Getenv) into
// Settings. Every value is checked here, at startup: a bad one is an error
// naming the variable and its valid range.
func LoadSettings(getenv func(string) string) (*Settings, error) {
	s := &Settings{}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var err error
	boolean := func(name string) bool {
		v := getenv(name)
		if v == "" || err != nil {
			return false
		}
		b, e := strconv.ParseBool(v)
		if e != nil {
			err = &SettingError{name, fmt.Sprintf("must be true or false (got %q)", v)}
		}
		return b
	}
	duration := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" || err != nil {
			return def
		}
		d, e := time.ParseDuration(v)
		if e != nil || d <= 0 {
			err = &SettingError{name, fmt.Sprintf("must be a positive duration such as 500ms or 10s (got %q)", v)}
		}
		return d
	}
	integer := func(name string, def, lo, hi int) int {
		v := getenv(name)
		if v == "" || err != nil {
			return def
		}
		n, e := strconv.Atoi(v)
		if e != nil || n < lo || n > hi {
			err = &SettingError{name, fmt.Sprintf("must be an integer from %d to %d (got %q)", lo, hi, v)}
		}
		return n
	}

	s.ConfigDir = filepath.Join(env("RUNTIME_ROOT", defaultRuntimeRoot), getenv("RUNTIME_SUBDIRECTORY"), env("RUNTIME_APPDIRECTORY", "config"))
	s.ReloadInterval = duration("XCLOAK_RELOAD_INTERVAL", time.Second)
	s.MergeDomains = boolean("MERGE_DOMAIN_CONFIG")
	s.MaxLimit = uint32(integer("XCLOAK_MAX_LIMIT", config.DefaultMaxLimit, 1, 1_000_000_000))
	s.GRPCAddr = net.JoinHostPort(env("GRPC_HOST", "0.0.0.0"), env("GRPC_PORT", "8081"))
	s.GRPCUDS = getenv("GRPC_UDS")
	s.GRPCMaxConnectionAge = duration("GRPC_MAX_CONNECTION_AGE", 24*time.Hour)
	s.GRPCMaxConnectionAgeGrace = duration("GRPC_MAX_CONNECTION_AGE_GRACE", time.Hour)
	s.HTTPAddr = net.JoinHostPort(env("HOST", "0.0.0.0"), env("PORT", "8080"))
	if boolean("USE_PROMETHEUS") {
		s.PrometheusAddr, s.PrometheusPath = env("PROMETHEUS_ADDR", ":9090"), env("PROMETHEUS_PATH", "/metrics")
	}
	s.RedisType = strings.ToUpper(env("REDIS_TYPE", "SINGLE"))
	s.RedisSocketType = strings.ToLower(env("REDIS_SOCKET_TYPE", "tcp"))
	s.RedisURL = env("REDIS_URL", "127.0.0.1:6379")
	s.RedisAuth = getenv("REDIS_AUTH")
	s.RedisSentinelAuth = getenv("REDIS_SENTINEL_AUTH")
	s.RedisTLS = boolean("REDIS_TLS")
	s.RedisPoolSize = integer("REDIS_POOL_SIZE", 10, 1, 100_000)
	s.RedisDialTimeout = duration("REDIS_TIMEOUT", 10*time.Second)
	s.KeyPrefix = getenv("CACHE_KEY_PREFIX")
	s.GlobalShadowMode = boolean("SHADOW_MODE")
	s.HealthyWithConfig = boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	s.Headers = HeaderOptions{
		Enabled:       boolean("LIMIT_RESPONSE_HEADERS_ENABLED"),
		Style:         xcloak.Style(env("XCLOAK_HEADER_STYLE", string(xcloak.StyleLegacy))),
		LimitName:     env("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
		RemainingName: env("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
		ResetName:     env("LIMIT_RESET_HEADER", "RateLimit-Reset"),
	}
	s.Timeout = duration("XCLOAK_TIMEOUT", time.Second)
	s.MaxStatsKeys = integer("XCLOAK_MAX_STATS_KEYS", DefaultMaxStatsKeys, 1, 10_000_000)
	s.BlockCache = integer("XCLOAK_BLOCK_CACHE", 10_000, 0, 1_000_000)
	s.LogLevel = strings.ToLower(env("LOG_LEVEL", "warn"))
	s.LogFormat = strings.ToLower(env("LOG_FORMAT", "text"))
	if err != nil {
		return nil, err
	}

	if v := env("NEAR_LIMIT_RATIO", "0.8"); true {
		r, e := strconv.ParseFloat(v, 64)
		if e != nil || r <= 0 || r > 1 {
			return nil, &SettingError{"NEAR_LIMIT_RATIO", fmt.Sprintf("must be a number above 0 and at most 1 (got %q)", v)}
		}
		s.NearLimitRatio = r
	}
	switch s.RedisType {
	case "SINGLE", "CLUSTER", "SENTINEL":
	default:
		return nil, &SettingError{"REDIS_TYPE", fmt.Sprintf("must be SINGLE, CLUSTER or SENTINEL (got %q)", s.RedisType)}
	}
	switch s.RedisSocketType {
	case "tcp", "unix":
	default:
		return nil, &SettingError{"REDIS_SOCKET_TYPE", fmt.Sprintf("must be tcp or unix (got %q)", s.RedisSocketType)}
	}
	if s.RedisType == "SENTINEL" && len(strings.Split(s.RedisURL, ",")) < 2 {
		return nil, &SettingError{"REDIS_URL", "with REDIS_TYPE=SENTINEL it is the master's name then the sentinels: name,host:port[,host:port...]"}
	}
	if b := getenv("BACKEND_TYPE"); b != "" && b != "redis" {
		return nil, &SettingError{"BACKEND_TYPE", fmt.Sprintf("xcloak-ratelimit keeps its windows in Redis only (got %q)", b)}
	}
	if c := getenv("CONFIG_TYPE"); c != "" && strings.ToUpper(c) != "FILE" {
		return nil, &SettingError{"CONFIG_TYPE", fmt.Sprintf("only FILE is supported (got %q)", c)}
	}
	switch s.Headers.Style {
	case xcloak.StyleLegacy, xcloak.StyleIETF, xcloak.StyleBoth:
	default:
		return nil, &SettingError{"XCLOAK_HEADER_STYLE", fmt.Sprintf("must be legacy, ietf or both (got %q)", s.Headers.Style)}
	}
	switch p := strings.ToLower(env("XCLOAK_ON_ERROR", "raise")); p {
	case "raise":
		s.OnError = xcloak.PolicyRaise
	case "allow":
		s.OnError = xcloak.PolicyAllow
	case "deny":
		s.OnError = xcloak.PolicyDeny
	default:
		return nil, &SettingError{"XCLOAK_ON_ERROR", fmt.Sprintf("must be raise, allow or deny (got %q)", p)}
	}
	switch f := strings.ToLower(env("XCLOAK_FALLBACK", "auto")); f {
	case "auto":
		s.Fallback = xcloak.FallbackAuto
	case "always":
		s.Fallback = xcloak.FallbackAlways
	case "never":
		s.Fallback = xcloak.FallbackNever
	default:
		return nil, &SettingError{"XCLOAK_FALLBACK", fmt.Sprintf("must be auto, always or never (got %q)", f)}
	}
	if r := getenv("XCLOAK_DURABLE_REPLICAS"); r != "" {
		n, e := strconv.Atoi(r)
		if e != nil || n < 1 || n > 100 {
			return nil, &SettingError{"XCLOAK_DURABLE_REPLICAS", fmt.Sprintf("must be an integer from 1 to 100 (got %q)", r)}
		}
		d := duration("XCLOAK_DURABLE_TIMEOUT", 100*time.Millisecond)
		if err != nil {
			return nil, err
		}
		s.Durable = &xcloak.Durable{Replicas: n, Timeout: d}
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "warning", "error", "fatal", "panic", "trace":
	default:
		return nil, &SettingError{"LOG_LEVEL", fmt.Sprintf("must be debug, info, warn or error (got %q)", s.LogLevel)}
	}
	for _, name := range ignorable {
		if getenv(name) != "" {
			s.Ignored = append(s.Ignored, name)
		}
	}
	sort.Strings(s.Ignored)
	return s, nil
}

// RedisClient opens the go-redis client the settings describe, with
// ContextTimeoutEnabled (xcloak's calls are cut at their deadline).
func (s *Settings) RedisClient() redis.UniversalClient {
	var tlsConfig *tls.Config
	if s.RedisTLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	user, password := "", s.RedisAuth
	if u, p, ok := strings.Cut(s.RedisAuth, ":"); ok {
		user, password = u, p
	}
	switch s.RedisType {
	case "CLUSTER":
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: strings.Split(s.RedisURL, ","), Username: user, Password: password, TLSConfig: tlsConfig,
			PoolSize: s.RedisPoolSize, DialTimeout: s.RedisDialTimeout, ContextTimeoutEnabled: true,
		})
	case "SENTINEL":
		parts := strings.Split(s.RedisURL, ",")
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: parts[0], SentinelAddrs: parts[1:], SentinelPassword: s.RedisSentinelAuth,
			Username: user, Password: password, TLSConfig: tlsConfig,
			PoolSize: s.RedisPoolSize, DialTimeout: s.RedisDialTimeout, ContextTimeoutEnabled: true,
		})
	}
	return redis.NewClient(&redis.Options{
		Network: s.RedisSocketType, Addr: s.RedisURL, Username: user, Password: password, TLSConfig: tlsConfig,
		PoolSize: s.RedisPoolSize, DialTimeout: s.RedisDialTimeout, ContextTimeoutEnabled: true,
	})
}

// LimiterOptions are the xcloak.Options of the settings.
func (s *Settings) LimiterOptions() xcloak.Options {
	blockCache := s.BlockCache
	if blockCache == 0 {
		blockCache = -1 // XCLOAK_BLOCK_CACHE=0: off (Options.BlockCache's 0 is its default)
	}
	return xcloak.Options{Prefix: s.KeyPrefix, OnError: s.OnError, Timeout: s.Timeout, Fallback: s.Fallback, Durable: s.Durable, BlockCache: blockCache}
}

// ServiceOptions are the Service's options of the settings.
func (s *Settings) ServiceOptions() ServiceOptions {
	return ServiceOptions{NearLimitRatio: s.NearLimitRatio, GlobalShadowMode: s.GlobalShadowMode, Headers: s.Headers, MaxLimit: s.MaxLimit}
}
