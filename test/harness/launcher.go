package harness

import (
	"runtime"
	"testing"
)

// Why processes started with Pdeathsig are forked from threads that live until the test
// ends:
//
// test/controlplane starts etcd and kube-apiserver with Pdeathsig=SIGKILL, and Linux sends
// that signal when the *thread* that forked the child exits, not the process. The suites
// open every socket inside a namespace through netns.NS.Do, which deliberately ends its
// locked thread afterwards — and Go may run such a goroutine on the very thread that once
// forked kube-apiserver. The first run of test/e2ecp lost its restarted kube-apiserver
// that way ("signal: killed" while waiting for /readyz). So every such process is forked
// from a locked thread that is kept until it has been stopped: the test's own (PinThread)
// or a Launcher's.

// PinThread locks the calling test goroutine to its thread for the rest of the test,
// cleanups included, so that processes it starts keep their parent thread. Call it before
// anything registers a cleanup that must run while the thread is still held.
func PinThread(t testing.TB) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread) // registered first, so it runs last
}

// Launcher runs functions on one goroutine locked to its thread, which ends only when
// the test's cleanups reach it: processes started there keep their parent thread.
type Launcher struct {
	work chan func()
}

// NewLauncher starts the launcher's thread; create it before the processes it will start
// are registered for cleanup, so the thread outlives them.
func NewLauncher(t testing.TB) *Launcher {
	l := &Launcher{work: make(chan func())}
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

// Run calls f on the launcher's thread and returns when it has returned. f must not call
// t.Fatal or t.Skip: it does not run on the test's goroutine.
func (l *Launcher) Run(f func()) {
	done := make(chan struct{})
	l.work <- func() {
		defer close(done)
		f()
	}
	<-done
}
