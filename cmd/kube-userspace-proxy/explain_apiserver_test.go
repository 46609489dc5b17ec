package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// explainCommand starts this test binary as `kube-userspace-proxy explain
// args...`, its stdout and stderr in the buffers.
func explainCommand(t *testing.T, args ...string) (cmd *exec.Cmd, stdout, stderr *bytes.Buffer) {
	t.Helper()
	cmd = exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "explain"}, args...)...)
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, stdout, stderr
}

// waitExit waits at most limit for cmd and returns its exit status.
func waitExit(t *testing.T, cmd *exec.Cmd, limit time.Duration, stderr *bytes.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("explain still running after %s:\n%s", limit, stderr)
		return -1
	}
}

// An API server that does not answer: explain says at once what it waits
// for, and gives up after --timeout with the last dial error (it said
// nothing for 30 s, then retried forever).
func TestExplainUnreachableAPIServerGivesUp(t *testing.T) {
	cmd, stdout, stderr := explainCommand(t, "--master", "http://127.0.0.1:1", "--timeout", "2s")
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	got := stderr.String()
	for _, want := range []string{
		"waiting for the API server at http://127.0.0.1:1 for up to 2s (--timeout)\n",
		"the API server at http://127.0.0.1:1 did not answer within 2s (--timeout); last error: ",
		"connection refused",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stderr lacks %q:\n%s", want, got)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout:\n%s", stdout)
	}
}

// Ctrl-C while waiting for the API server: "interrupted" and a non-zero
// exit, without client-go's "Unable to sync caches" (UnhandledError) line
// or "context canceled".
func TestExplainInterruptedWhileWaiting(t *testing.T) {
	cmd, _, stderr := explainCommand(t, "--master", "http://127.0.0.1:1")
	time.Sleep(time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 130 { // 128 + SIGINT
		t.Errorf("exit %d, want 130", code)
	}
	got := stderr.String()
	if !strings.Contains(got, "kube-userspace-proxy explain: interrupted") {
		t.Errorf("stderr does not say it was interrupted:\n%s", got)
	}
	for _, bad := range []string{"UnhandledError", "Unable to sync caches", "context canceled"} {
		if strings.Contains(got, bad) {
			t.Errorf("stderr holds %q:\n%s", bad, got)
		}
	}
}
