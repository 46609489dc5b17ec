package relay

import (
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// Bytes the loop read from the client and then failed to write (the
// backend reset before the loop saw it) are not counted as moved: Ended
// reports what reached the backend. The loop is held (its only loop,
// blocked accepting a second client) while the client sends and the
// backend resets, so that its next poll finds the client's bytes first
// and the write of them meets the reset. (TestLoopCountsDeliveredBytesOnWriteError's
// reset comes after the backend's FIN, which the loop passes on at once
// and then ends the connection before it reads any more.)
func TestLoopWriteErrorTakesBackTheBytesRead(t *testing.T) {
	b := newLoopBedOf(t, 1, LoopOptions{})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	pass(t, client, backend, "hi")
	proxyBackend := h.connected(t).backendFD

	accepting := make(chan struct{}, 1)
	b.onAccept.Store(func(int) { accepting <- struct{}{} })
	second, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(b.front)) // the kernel's handshake
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	select {
	case <-accepting: // the loop waits in Accepted for b.next
	case <-time.After(10 * time.Second):
		t.Fatal("the loop never accepted the second client")
	}
	if _, err := client.Write(make([]byte, 300)); err != nil {
		t.Fatal(err)
	}
	_ = backend.SetLinger(0)
	backend.Close()
	deadline := time.Now().Add(5 * time.Second)
	for rawio.TCPState(proxyBackend) != rawio.TCPClose {
		if time.Now().After(deadline) {
			t.Fatal("the backend's reset never reached the proxy's socket")
		}
		time.Sleep(time.Millisecond)
	}
	b.next <- newLoopHandler() // no endpoint: the second client is refused
	h.wait(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.in != 2 {
		t.Fatalf("counted %d bytes client→backend; 2 reached the backend, then the 300 read met its reset", h.in)
	}
}
