// Command pause is the pod sandbox's process for the real-kubelet lane (TEKTON_MUTEX_KUBELET=real):
// it holds the pod's namespaces open and does nothing else, like registry.k8s.io/pause, which cannot
// be pulled here. As PID 1 it reaps adopted children and exits on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
