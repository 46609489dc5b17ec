package main

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/demo"
)

// Ctrl-C during `demo --netns` whose namespaces then could not be removed:
// the interruption is said as one (exit 130), and so is what it left on the
// machine, with how to remove it. The interruption's line alone hid it,
// though Ctrl-C is the path where the removal runs after an error.
func TestDemoNetNSInterruptedSaysTheNamespacesLeft(t *testing.T) {
	saved := demoRunNetNS
	t.Cleanup(func() { demoRunNetNS = saved })
	demoRunNetNS = func(ctx context.Context, _ io.Writer, _ demo.Options, _ demo.Command) (bool, error) {
		// Ctrl-C, caught by runDemo's stop signals, then a removal that
		// fails, reported as RunNetNS reports it.
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			return false, err
		}
		<-ctx.Done()
		return false, &demo.CleanupError{Err: ctx.Err(), Cleanup: errors.New("ip netns del kup-demo-node: exit status 1")}
	}
	var code int
	// --verbose: klog's output is left as it is.
	stderr := capture(t, &os.Stderr, func() { code = runDemo([]string{"--netns", "--verbose"}) })
	if code != exitInterrupted {
		t.Errorf("exit %d, want %d (interrupted)\n%s", code, exitInterrupted, stderr)
	}
	for _, want := range []string{"interrupted", "ip netns del kup-demo-node: exit status 1", "remove them with: ip netns del NAME"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}
