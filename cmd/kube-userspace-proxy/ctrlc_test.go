package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runAsCommand lets a test run this test binary as the command itself:
// with KUP_TEST_MAIN set, TestMain runs main's body on the arguments after
// "--" and exits with its status.
const runAsCommand = "KUP_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsCommand) != "" {
		os.Args = append([]string{os.Args[0]}, commandArgs()...)
		main()
	}
	os.Exit(m.Run())
}

// commandArgs are the arguments after "--", or all of them when there is
// none: the command started again by itself (demo --netns runs the proxy
// as os.Executable() with the proxy's flags only).
func commandArgs() []string {
	for i, a := range os.Args {
		if a == "--" {
			return os.Args[i+1:]
		}
	}
	return os.Args[1:]
}

// selfCommand is this test binary run as the command on args
// (runAsCommand), through wrapper (nohup) when one is given.
func selfCommand(wrapper string, args ...string) *exec.Cmd {
	argv := append([]string{os.Args[0], "-test.run=^$", "--"}, args...)
	if wrapper != "" {
		argv = append([]string{wrapper}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	return cmd
}

// startLines starts cmd and returns the lines it writes on stdout, or on
// stderr with fromStderr, as they come; the channel closes with the
// stream. The process is killed when the test ends.
func startLines(t *testing.T, cmd *exec.Cmd, fromStderr bool) <-chan string {
	t.Helper()
	pipe := cmd.StdoutPipe
	if fromStderr {
		pipe = cmd.StderrPipe
	}
	r, err := pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// waitServing adds lines to out until one holds serving; the test fails
// if what (the demo, the proxy) ends first, or within timeout does not.
func waitServing(t *testing.T, lines <-chan string, out *[]string, serving, what string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("%s ended before serving:\n%s", what, strings.Join(*out, "\n"))
			}
			*out = append(*out, l)
			if strings.Contains(l, serving) {
				return
			}
		case <-deadline:
			t.Fatalf("%s not serving after %v:\n%s", what, timeout, strings.Join(*out, "\n"))
		}
	}
}

// Ctrl-C ends `demo --serve` cleanly: exit 0 and the goodbye line, which
// is what `make serve` needs to end without "make: *** Error".
func TestDemoServeCtrlCExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo (~20 s)")
	}
	cmd := selfCommand("", "demo", "--serve")
	lines := startLines(t, cmd, false)
	var out []string
	waitServing(t, lines, &out, "The manifests:", "demo", 2*time.Minute)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		out = append(out, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after Ctrl-C: %v, want exit 0\n%s", err, strings.Join(out, "\n"))
	}
	if !strings.Contains(strings.Join(out, "\n"), "Stopping: proxy sockets, backends and the manifest directory are removed.") {
		t.Errorf("no goodbye line:\n%s", strings.Join(out, "\n"))
	}
}

// Ctrl-C during the experiments (before `demo --serve` serves, or in a
// plain `demo`): an interruption, said as one, with the shell's 130 as
// explain's, not "demo: context canceled" and exit 1, which `make serve`
// and `make demo` reported as the demo failing.
func TestDemoCtrlCDuringExperimentsIsAnInterruption(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo's start (~5 s)")
	}
	cmd := selfCommand("", "demo", "--serve")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	lines := startLines(t, cmd, false)
	var out []string
	waitServing(t, lines, &out, "Running 9 experiments", "demo", 2*time.Minute)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		out = append(out, l)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
		t.Errorf("after Ctrl-C: %v, want exit %d\n%s", err, exitInterrupted, stderr.String())
	}
	if got := stderr.String(); !strings.Contains(got, "kube-userspace-proxy demo: interrupted") || strings.Contains(got, "context canceled") {
		t.Errorf("stderr does not say it was interrupted (or says context canceled):\n%s", got)
	}
}
