//go:build tools

// Package tools pins the binaries hack/build.sh compiles from this module: etcd, and etcdutl
// for the snapshot restore of tests/etcd_restore.rs.
package tools

import (
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
