package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// demo --netns as a user runs it: this test binary as the command (and, in
// the node namespace, as the proxy), real namespaces, iptables and conntrack.

func requireNetNSDemo(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the whole demo through namespaces (~20-35 s)")
	}
	if os.Geteuid() != 0 {
		t.Skip("demo --netns needs root (namespaces, iptables); skipping")
	}
	for _, tool := range []string{"ip", "iptables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed; skipping", tool)
		}
	}
}

// startNetNSDemo runs `demo --netns` and returns its stdout as lines arrive.
func startNetNSDemo(t *testing.T) (*exec.Cmd, <-chan string, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "demo", "--netns")
	cmd.Env = append(os.Environ(), runAsCommand+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 10000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines, &stderr
}

var (
	namespacesRE = regexp.MustCompile(`(kup-demo-node-[0-9a-f]+) \(the node.*\n?.*and (kup-demo-client-[0-9a-f]+)`)
	manifestsRE  = regexp.MustCompile(`--manifests (\S+)`)
)

// checkNothingLeft: the run's namespaces, manifest directory and proxy
// process are gone.
func checkNothingLeft(t *testing.T, out string) {
	t.Helper()
	ns := namespacesRE.FindStringSubmatch(out)
	dir := manifestsRE.FindStringSubmatch(out)
	if ns == nil || dir == nil {
		t.Fatalf("output names no namespaces or manifest directory:\n%s", out)
	}
	list, _ := exec.Command("ip", "netns", "list").Output()
	for _, name := range ns[1:] {
		if strings.Contains(string(list), name) {
			t.Errorf("namespace %s is still there", name)
			_ = exec.Command("ip", "netns", "del", name).Run()
		}
	}
	if _, err := os.Stat(dir[1]); err == nil {
		t.Errorf("manifest directory %s is still there", dir[1])
	}
	// The proxy ran with that directory on its command line.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if cl, err := os.ReadFile(p); err == nil && bytes.Contains(cl, []byte(dir[1])) {
			t.Errorf("a process still runs with %s: %s (%q)", dir[1], p, bytes.ReplaceAll(cl, []byte{0}, []byte{' '}))
		}
	}
}

func TestDemoNetNS(t *testing.T) {
	requireNetNSDemo(t)
	cmd, lines, stderr := startNetNSDemo(t)
	var out strings.Builder
	for l := range lines {
		out.WriteString(l + "\n")
	}
	err := cmd.Wait()
	text := out.String()
	t.Log("\n" + text)
	if err != nil {
		t.Fatalf("demo --netns: %v\n%s", err, stderr.String())
	}
	for _, want := range []*regexp.Regexp{
		// The path names the real portal rule, DNAT to the proxy socket on the node IP.
		regexp.MustCompile(`portal rule +this iptables rule rewrites the destination`),
		regexp.MustCompile(`-A KUBE-PORTALS-CONTAINER -d 10\.96\.0\.10/32 -p tcp[\s│]+.*--dport 80[\s│]+-j DNAT[\s│]+--to-destination[\s│]+10\.77\.0\.1:(\d+)`),
		regexp.MustCompile(`proxy socket +10\.77\.0\.1:\d+`),
		regexp.MustCompile(`Every outcome matched the real cluster: yes \(9 of 9\)`),
		regexp.MustCompile(`Every fault behaved as expected: yes \(4 of 4\)`),
		// The rules, as iptables-save prints them.
		regexp.MustCompile(`(?m)^\*nat\n(.*\n)*-A PREROUTING .*-j KUBE-PORTALS-CONTAINER`),
		regexp.MustCompile(`(?m)^-A KUBE-PORTALS-CONTAINER -d 10\.96\.0\.12/32 -p udp .*--dport 7 -j DNAT --to-destination 10\.77\.0\.1:\d+$`),
		regexp.MustCompile(`(?m)^\*filter\n(.*\n)*-A KUBE-PROXY-PORT-GUARD `),
		// Conntrack: where it was read from, the DNATed entries per Service.
		regexp.MustCompile(`Connection tracking in the node namespace: \d+ entries, read from\s+(/proc/net/nf_conntrack|conntrack -L|netlink)`),
		// A client's entry to the ClusterIP is answered by the proxy socket.
		regexp.MustCompile(`client → web:http TCP\s+\d+\s+10\.77\.0\.\d+:\d+ → 10\.96\.0\.10:80\s+10\.77\.0\.1:\d+\n`),
		regexp.MustCompile(`client → echo:echo UDP\s+6\s+10\.77\.0\.11:\d+ → 10\.96\.0\.12:7\s+10\.77\.0\.1:\d+\n`),
		regexp.MustCompile(`proxy → backend-a\s+\d+\s+10\.244\.0\.11:\d+ →\s+10\.244\.0\.11:\d+\s+10\.244\.0\.11:\d+\n`),
		regexp.MustCompile(`Cleaned up: the proxy stopped`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output lacks %q", want)
		}
	}
	checkNothingLeft(t, text)
}

// Ctrl-C in the middle of the experiments: the command ends, and the
// namespaces (with their rules), the proxy and the manifests are gone.
func TestDemoNetNSCtrlCCleansUp(t *testing.T) {
	requireNetNSDemo(t)
	cmd, lines, stderr := startNetNSDemo(t)
	var out strings.Builder
	deadline := time.After(60 * time.Second)
	for running := false; !running; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("demo ended before the experiments: %v\n%s%s", cmd.Wait(), out.String(), stderr.String())
			}
			out.WriteString(l + "\n")
			running = strings.HasPrefix(l, "Running 9 experiments")
		case <-deadline:
			t.Fatalf("no experiments after 60 s:\n%s", out.String())
		}
	}
	time.Sleep(2 * time.Second) // in the middle of them
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for l := range lines {
			out.WriteString(l + "\n")
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		t.Logf("after Ctrl-C: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after Ctrl-C:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "Cleaned up:") {
		t.Errorf("no cleanup line after Ctrl-C:\n%s", out.String())
	}
	checkNothingLeft(t, out.String())
}
