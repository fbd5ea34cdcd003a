module tekton-mutex.dev/hack/tools/pause

go 1.26
