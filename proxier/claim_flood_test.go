package proxier

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// A held UDP port whose errors are spent stops reading for a while, so a
// flood fills its buffer and the kernel drops the rest, as before held
// ports answered: reading each datagram only to find it could not be
// answered cost half a core at 160,000 datagrams a second.
func TestHeldUDPPortPausesWhenItMayNotAnswer(t *testing.T) {
	old := heldRefusePause.Load()
	heldRefusePause.Store(int64(time.Minute))
	t.Cleanup(func() { heldRefusePause.Store(old) })

	refuse := newUnreachableSender()
	refuse.limit = rate.NewLimiter(0, 0) // every error spent
	t.Cleanup(refuse.close)
	held, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enableDestinationInfo(held); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { refuseHeldDatagrams(held, refuse); close(done) }()
	t.Cleanup(func() { held.Close(); <-done })

	client, err := net.DialUDP("udp4", nil, held.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const sent = 20
	for range sent {
		if _, err := client.Write([]byte("flood")); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := held.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		n := 0
		_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return n // the first queued datagram's length: 0 when none is
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if queued() == 0 {
			t.Fatalf("the held port read all %d datagrams it could not answer; want it to stop reading after the first", sent)
		}
	}
}
