package controlplane

import (
	"net"
	"strconv"
	"testing"
)

// TestStartRetriesTakenPort hands the first attempt a port someone else holds, as can
// happen between choosing a free port and binding it, and expects a start on other ports.
func TestStartRetriesTakenPort(t *testing.T) {
	bins := FindBinaries(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, port, _ := net.SplitHostPort(taken.Addr().String())
	takenPort, _ := strconv.Atoi(port)

	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[0] = takenPort // etcd's client port
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })

	cp, err := start(bins, Options{})
	if cp != nil {
		t.Cleanup(cp.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("ports chosen %d times, want 2", calls)
	}
	if !cp.authorizes() {
		t.Error("the control plane started on the second ports does not answer")
	}
}
