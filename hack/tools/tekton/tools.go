//go:build tools

// Package tools pins the binaries hack/build.sh compiles from this module.
package tools

import (
	_ "github.com/tektoncd/pipeline/cmd/controller"
	_ "github.com/tektoncd/pipeline/cmd/entrypoint"
	_ "github.com/tektoncd/pipeline/cmd/nop"
	_ "github.com/tektoncd/pipeline/cmd/sidecarlogresults"
	_ "github.com/tektoncd/pipeline/cmd/workingdirinit"
)
