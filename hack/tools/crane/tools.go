//go:build tools

// Package tools pins the image tool hack/release.sh compiles from this module:
// crane packs and pushes OCI images without a container runtime.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
