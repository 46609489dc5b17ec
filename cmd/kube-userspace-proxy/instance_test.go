package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	testingclock "k8s.io/utils/clock/testing"
)

// A second claim in the namespace learns the holder's PID, and the holder
// logs the process that found it; once released, the name is free again.
func TestSecondInstanceFindsTheFirst(t *testing.T) {
	saved := instanceSocket
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	defer func() { instanceSocket = saved }()
	logs := captureKlog(t)

	if pid := holderPID(); pid != 0 {
		t.Fatalf("holderPID with no holder = %d, want 0", pid)
	}
	first, other := claimInstance()
	if first == nil || other != 0 {
		t.Fatalf("first claim = %v, other %d; want held, 0", first, other)
	}
	second, other := claimInstance()
	if second != nil || other != os.Getpid() {
		t.Fatalf("second claim = %v, other %d; want nil, %d", second, other, os.Getpid())
	}
	want := fmt.Sprintf("pid=%d", os.Getpid())
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the holder did not log the process that found it:\n%s", logs.String())
		}
	}
	// The same process again within the minute: not logged again (klog
	// writes a line once per severity it reaches: count, then compare).
	time.Sleep(100 * time.Millisecond)
	logged := strings.Count(logs.String(), want)
	if _, other := claimInstance(); other != os.Getpid() {
		t.Fatalf("third claim's other = %d", other)
	}
	time.Sleep(100 * time.Millisecond)
	if n := strings.Count(logs.String(), want); n != logged {
		t.Fatalf("the holder logged the same process again within a minute:\n%s", logs.String())
	}
	first.release()
	third, other := claimInstance()
	if third == nil || other != 0 {
		t.Fatalf("claim after release = %v, other %d; want held, 0", third, other)
	}
	third.release()
	var none *instanceClaim
	none.release() // the claim of a process that found another: nothing to do
}

// TestInstanceConnectHelper is a process of its own for
// TestInstanceLogIsBounded: it finds the holder of the socket it is given.
func TestInstanceConnectHelper(t *testing.T) {
	name := os.Getenv("KUP_TEST_INSTANCE_SOCKET")
	if name == "" {
		t.Skip("a helper process of TestInstanceLogIsBounded")
	}
	instanceSocket = name
	if holderPID() == 0 {
		t.Fatal("no holder found")
	}
}

// Any process of the namespace may connect to the instance socket: fifteen
// of them get ten lines logged, not fifteen.
func TestInstanceLogIsBounded(t *testing.T) {
	saved := instanceSocket
	instanceSocket = fmt.Sprintf("@kube-userspace-proxy.test.%d.%d", os.Getpid(), time.Now().UnixNano())
	savedLimiter := newInstanceLogLimiter
	defer func() { instanceSocket, newInstanceLogLimiter = saved, savedLimiter }()
	// Time stands still: no token comes back while the helpers start.
	newInstanceLogLimiter = func() flowcontrol.RateLimiter {
		return flowcontrol.NewTokenBucketRateLimiterWithClock(1.0/6, 10, testingclock.NewFakeClock(time.Now()))
	}
	logs := captureKlog(t)
	claim, _ := claimInstance()
	if claim == nil {
		t.Fatal("no claim")
	}
	defer claim.release()
	pids := map[int]bool{}
	for range 15 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInstanceConnectHelper$")
		cmd.Env = append(os.Environ(), "KUP_TEST_INSTANCE_SOCKET="+instanceSocket)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		pids[cmd.Process.Pid] = true
	}
	time.Sleep(200 * time.Millisecond)
	logged := 0
	for pid := range pids {
		if strings.Contains(logs.String(), fmt.Sprintf("pid=%d\n", pid)) {
			logged++
		}
	}
	if logged != 10 {
		t.Fatalf("%d of 15 processes that found the holder were logged, want 10 (the burst)", logged)
	}
}
