package netns

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// Lab is one test's set of namespaces. All names share the Lab's random
// suffix, so concurrent runs (and leftovers of a crashed run) never collide.
type Lab struct {
	t      testing.TB
	Suffix string
}

// New returns an empty Lab for t with a fresh random suffix.
func New(t testing.TB) *Lab {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("netns: random suffix: %v", err)
	}
	return &Lab{t: t, Suffix: hex.EncodeToString(b)}
}

// NS creates the namespace "kup-<role>-<suffix>", brings its loopback up and
// registers its deletion with t.Cleanup (and with the interrupt handler, see
// interrupt.go).
func (l *Lab) NS(role string) *NS {
	l.t.Helper()
	name := fmt.Sprintf("kup-%s-%s", role, l.Suffix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		l.t.Fatalf("netns: ip netns add %s: %v: %s", name, err, out)
	}
	held(name)
	l.t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			l.t.Errorf("netns: ip netns del %s: %v: %s", name, err, out)
		}
		released(name)
	})
	ns := &NS{t: l.t, Name: name}
	ns.MustIP("link", "set", "lo", "up")
	return ns
}

// Exists reports whether a namespace of that name is present (for tests that
// verify cleanup).
func Exists(name string) bool {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}
