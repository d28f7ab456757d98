module github.com/xcloak/xcloak/docs/examples/go

go 1.24

require (
	github.com/redis/go-redis/v9 v9.19.0
	github.com/xcloak/xcloak/clients/go v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

// The package of this checkout (clients/go), not a published version.
replace github.com/xcloak/xcloak/clients/go => ../../../clients/go
