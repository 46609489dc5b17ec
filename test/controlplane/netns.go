package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// dialInNetNS returns a dial function whose sockets are created inside the network
// namespace at nsPath, so that the test process, which stays in its own namespace, can
// reach a control plane listening on that namespace's loopback.
func dialInNetNS(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			conn net.Conn
			err  error
		}
		done := make(chan result, 1)
		go func() {
			conn, err := dialFromNamespace(ctx, nsPath, network, addr)
			done <- result{conn, err}
		}()
		r := <-done
		return r.conn, r.err
	}
}

// dialFromNamespace runs on its own goroutine: it pins it to an OS thread, moves that
// thread into the namespace, creates the socket there and moves the thread back. A thread
// that cannot be moved back is never unlocked, so Go discards it with the goroutine.
func dialFromNamespace(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer home.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter %s: %w", nsPath, err)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return conn, err
}
