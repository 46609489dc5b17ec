package netns_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// envInterruptChild makes TestInterruptDeletesNamespaces the child that
// builds a lab and waits to be signalled.
const envInterruptChild = "KUP_NETNS_INTERRUPT_CHILD"

// A test binary stopped by SIGINT or SIGTERM runs no t.Cleanup; its
// namespaces stayed behind (10 of them from one interrupted make unit).
func TestInterruptDeletesNamespaces(t *testing.T) {
	netns.Require(t)
	if os.Getenv(envInterruptChild) != "" {
		ns := netns.New(t).NS("intr")
		os.Stdout.WriteString("ns " + ns.Name + "\n")
		time.Sleep(time.Minute) // until the parent's signal
		t.Fatal("not signalled")
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestInterruptDeletesNamespaces$", "-test.v")
			cmd.Env = append(os.Environ(), envInterruptChild+"=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			name := ""
			lines := bufio.NewScanner(out)
			for lines.Scan() {
				if n, ok := strings.CutPrefix(lines.Text(), "ns "); ok {
					name = n
					break
				}
			}
			if name == "" {
				t.Fatalf("the child made no namespace: %s", stderr.String())
			}
			t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
			if !netns.Exists(name) {
				t.Fatalf("namespace %s not made", name)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = bufio.NewReader(out).WriteTo(new(strings.Builder)) }()
			err = cmd.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 128+int(sig) {
				t.Errorf("child ended with %v, want exit status %d", err, 128+int(sig))
			}
			if netns.Exists(name) {
				t.Errorf("namespace %s left behind after %v; child's stderr: %s", name, sig, stderr.String())
			}
		})
	}
}
