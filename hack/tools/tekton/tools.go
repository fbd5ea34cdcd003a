//go:build tools

// Package tools pins the binary hack/build.sh compiles from this module.
package tools

import _ "github.com/tektoncd/pipeline/cmd/controller"
