package netns

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"sync"
	"syscall"
)

// A test binary stopped by Ctrl-C or SIGTERM (make interrupted, a CI
// timeout) dies before any t.Cleanup runs: its processes go with it
// (Pdeathsig), but the namespaces stay pinned under /run/netns. The
// namespaces a Lab holds are therefore also known here, and the first
// such signal deletes them before the binary exits.
var live = struct {
	sync.Mutex
	names map[string]bool
	watch sync.Once
}{names: map[string]bool{}}

// held records that namespace name exists until released.
func held(name string) {
	live.watch.Do(func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
		go func() { deleteOnSignal(<-c) }()
	})
	live.Lock()
	live.names[name] = true
	live.Unlock()
}

// released records that namespace name was deleted.
func released(name string) {
	live.Lock()
	delete(live.names, name)
	live.Unlock()
}

// heldNames lists the namespaces a signal would delete now.
func heldNames() []string {
	live.Lock()
	defer live.Unlock()
	names := make([]string, 0, len(live.names))
	for n := range live.names {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func deleteOnSignal(sig os.Signal) {
	names := heldNames()
	for _, n := range names {
		_ = exec.Command("ip", "netns", "del", n).Run()
	}
	fmt.Fprintf(os.Stderr, "netns: %v: deleted the %d namespaces this test binary held %v\n", sig, len(names), names)
	// The status a shell gives a process the signal killed.
	os.Exit(128 + int(sig.(syscall.Signal)))
}
