package e2ecp

import (
	"runtime"
	"testing"
)

// Why control-plane processes are started from threads that live until the test ends:
//
// test/controlplane starts etcd and kube-apiserver with Pdeathsig=SIGKILL, and Linux sends
// that signal when the *thread* that forked the child exits, not the process. This suite
// opens every socket inside a namespace through netns.NS.Do, which deliberately ends its
// locked thread afterwards — and Go may run such a goroutine on the very thread that once
// forked kube-apiserver. The first run of this suite lost its restarted kube-apiserver
// that way ("signal: killed" while waiting for /readyz). So every control-plane process
// is forked from a locked thread that is kept until the control plane has been stopped.

// pinTestThread locks the calling test goroutine to its thread for the rest of the test,
// cleanups included, so that processes it starts keep their parent thread. Call it before
// anything registers a cleanup that must run while the thread is still held.
func pinTestThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread) // registered first, so it runs last
}

// launcher runs functions on one goroutine locked to its thread, which ends only when
// the test's cleanups reach it: processes started there keep their parent thread.
type launcher struct {
	work chan func()
}

// newLauncher starts the launcher's thread; create it before the processes it will start
// are registered for cleanup, so the thread outlives them.
func newLauncher(t *testing.T) *launcher {
	l := &launcher{work: make(chan func())}
	quit := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for {
			select {
			case f := <-l.work:
				f()
			case <-quit:
				return
			}
		}
	}()
	t.Cleanup(func() { close(quit) })
	return l
}

// run calls f on the launcher's thread and returns when it has returned. f must not call
// t.Fatal or t.Skip: it does not run on the test's goroutine.
func (l *launcher) run(f func()) {
	done := make(chan struct{})
	l.work <- func() {
		defer close(done)
		f()
	}
	<-done
}
