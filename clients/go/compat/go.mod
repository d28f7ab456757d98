module github.com/xcloak/xcloak/clients/go/compat

go 1.24

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/redis/go-redis/v9 v9.19.0
	github.com/xcloak/xcloak/clients/go v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/xcloak/xcloak/clients/go => ../
