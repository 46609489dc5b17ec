package main

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// errLockHeld is what go-iptables returns when iptables-legacy gave up
// waiting for the xtables lock another process holds.
var errLockHeld = errors.New("running [/usr/sbin/ip6tables -t nat -S POSTROUTING 1 --wait 5]: exit status 4: " +
	"Another app is currently holding the xtables lock. Stopped waiting after 5s")

// lockedRunner is a fake whose first `locked` ChainExists calls fail as
// under a held xtables lock (<0: all of them), and so do all calls before
// heldUntil.
type lockedRunner struct {
	*iptables.FakeRunner
	locked    atomic.Int32
	heldUntil time.Time
}

func (r *lockedRunner) ChainExists(table iptables.Table, chain string) (bool, error) {
	if time.Now().Before(r.heldUntil) {
		return false, errLockHeld
	}
	if n := r.locked.Load(); n != 0 {
		r.locked.Add(-1)
		return false, errLockHeld
	}
	return r.FakeRunner.ChainExists(table, chain)
}

func newLockedRunner(f iptables.Family, locked int32) *lockedRunner {
	r := &lockedRunner{FakeRunner: iptables.NewFakeRunner(f)}
	r.locked.Store(locked)
	return r
}

// shortLockWait makes the start-up wait for a held lock fit a unit test.
func shortLockWait(t *testing.T) {
	oldWait, oldInterval := lockWait, lockRetryInterval
	lockWait, lockRetryInterval = 200*time.Millisecond, 10*time.Millisecond
	t.Cleanup(func() { lockWait, lockRetryInterval = oldWait, oldInterval })
}

// A lock another process holds during the start-up probe of ip6tables is
// not "no ip6tables": IPv6 was left off until a restart, its Services
// refused and their old portals DNATing to ports nothing listened on. The
// probe is retried; a lock held past the wait still serves IPv6, whose
// syncs retry until the lock frees.
func TestIPv6ProbeUnderHeldLock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		locked  int32
		wantLog string
	}{
		{"freed while waiting", 2, "waiting for it"},
		{"held past the wait", -1, "IPv6 is served and its syncs retry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shortLockWait(t)
			logs := captureKlog(t)
			r4, r6 := iptables.NewFakeRunner(iptables.IPv4), newLockedRunner(iptables.IPv6, tc.locked)
			v4, v6, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("::")}, func(f iptables.Family) (iptables.Runner, error) {
				if f == iptables.IPv6 {
					return r6, nil
				}
				return r4, nil
			})
			if err != nil {
				t.Fatalf("portalSyncers: %v", err)
			}
			if v4 == nil || v6 == nil {
				t.Fatalf("syncers IPv4 %v, IPv6 %v; want both", v4 != nil, v6 != nil)
			}
			klog.Flush()
			if strings.Contains(logs.String(), "No iptables support for family") || !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log does not say %q, or says IPv6 unsupported:\n%s", tc.wantLog, logs)
			}
		})
	}
}

// At start, an xtables lock held past iptables' own 5 s wait exited 1 at
// once (a CrashLoopBackOff under kubelet), with a hint blaming root or a
// missing iptables. The probe waits the lock out; held past lockWait, the
// error says the lock is held by another process, and nothing else.
func TestIPv4ProbeUnderHeldLock(t *testing.T) {
	shortLockWait(t)
	logs := captureKlog(t)
	r4 := newLockedRunner(iptables.IPv4, 2)
	runners := func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return iptables.NewFakeRunner(iptables.IPv6), nil
		}
		return r4, nil
	}
	if v4, _, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("0.0.0.0")}, runners); err != nil || v4 == nil {
		t.Fatalf("portalSyncers with the lock freed after 2 tries: IPv4 syncer %v, %v", v4 != nil, err)
	}
	klog.Flush()
	if n := strings.Count(logs.String(), "The xtables lock is held by another process: waiting"); n != 2 {
		t.Errorf("%d waits logged, want 2:\n%s", n, logs)
	}

	r4.locked.Store(-1)
	_, _, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("0.0.0.0")}, runners)
	if err == nil || !strings.Contains(err.Error(), "xtables lock is held by another process") || strings.Contains(err.Error(), "run as root") {
		t.Errorf("portalSyncers under a lock held past the wait: %v; want it to name the held lock, without the root hint", err)
	}
}

// A stop during the IPv6 probe's wait ends start-up there: it went on to
// log that IPv6 was served and, with a --bind-address of one family, to
// clean that family's rules under the held lock (12 tries of 5 s each: 77 s
// from start to exit, a SIGTERM at 9 s).
func TestStopDuringIPv6ProbeEndsStartUp(t *testing.T) {
	oldWait, oldInterval := lockWait, lockRetryInterval
	lockWait, lockRetryInterval = time.Minute, 10*time.Millisecond
	t.Cleanup(func() { lockWait, lockRetryInterval = oldWait, oldInterval })
	logs := captureKlog(t)
	r4, r6 := iptables.NewFakeRunner(iptables.IPv4), newLockedRunner(iptables.IPv6, -1)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, _, err := portalSyncers(ctx, &validated{bind: netip.MustParseAddr("127.0.0.1")}, func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return r6, nil
		}
		return r4, nil
	})
	if took := time.Since(start); err == nil || took > 2*time.Second {
		t.Errorf("portalSyncers stopped 100 ms in: returned %v after %v; want the stop, at once", err, took)
	}
	klog.Flush()
	if strings.Contains(logs.String(), "IPv6 is served") {
		t.Errorf("a stopped start-up logged IPv6 as served:\n%s", logs)
	}
}

// Both families' probes share one wait: each waiting its own, a lock held
// through start-up took twice as long (about 52 s), past the example
// DaemonSet's liveness probe. The IPv4 lock is freed half-way through the
// 2 s wait by the clock: freed after a number of 10 ms tries, a loaded
// machine's slower tries left it held past the wait (CI at load 10:
// "portalSyncers: IPv4 false, IPv6 false, iptables: the xtables lock is
// held by another process (waited 1s for it)").
func TestLockWaitSharedByBothFamilies(t *testing.T) {
	oldWait, oldInterval := lockWait, lockRetryInterval
	lockWait, lockRetryInterval = 2*time.Second, 10*time.Millisecond
	t.Cleanup(func() { lockWait, lockRetryInterval = oldWait, oldInterval })
	r4, r6 := newLockedRunner(iptables.IPv4, 0), newLockedRunner(iptables.IPv6, -1)
	start := time.Now()
	r4.heldUntil = start.Add(time.Second)
	v4, v6, err := portalSyncers(context.Background(), &validated{bind: netip.MustParseAddr("::")}, func(f iptables.Family) (iptables.Runner, error) {
		if f == iptables.IPv6 {
			return r6, nil
		}
		return r4, nil
	})
	if err != nil || v4 == nil || v6 == nil {
		t.Fatalf("portalSyncers: IPv4 %v, IPv6 %v, %v", v4 != nil, v6 != nil, err)
	}
	// Shared: 2 s in all; each its own: 1 s for IPv4, then 2 s for IPv6.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("start-up waited %v for the lock with a 2 s wait: each family waited its own", took)
	}
}
