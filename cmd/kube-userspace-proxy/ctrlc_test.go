package main

import (
	"bufio"
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

// Ctrl-C ends `demo --serve` cleanly: exit 0 and the goodbye line, which
// is what `make serve` needs to end without "make: *** Error".
func TestDemoServeCtrlCExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole demo (~20 s)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "demo", "--serve")
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out []string
	deadline := time.After(2 * time.Minute)
	for serving := false; !serving; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("demo ended before serving:\n%s", strings.Join(out, "\n"))
			}
			out = append(out, l)
			serving = strings.Contains(l, "The manifests:")
		case <-deadline:
			t.Fatalf("demo not serving after 2 min:\n%s", strings.Join(out, "\n"))
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		out = append(out, l)
	}
	err = cmd.Wait()
	if err != nil {
		t.Fatalf("after Ctrl-C: %v, want exit 0\n%s", err, strings.Join(out, "\n"))
	}
	if !strings.Contains(strings.Join(out, "\n"), "Stopping: proxy sockets, backends and the manifest directory are removed.") {
		t.Errorf("no goodbye line:\n%s", strings.Join(out, "\n"))
	}
}
