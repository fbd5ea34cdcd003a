//go:build tools

// Package tools pins the binary hack/build.sh compiles from this module.
package tools

import _ "go.etcd.io/etcd/server/v3"
