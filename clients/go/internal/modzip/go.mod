module github.com/xcloak/xcloak/clients/go/internal/modzip

go 1.24.0

require golang.org/x/mod v0.30.0
