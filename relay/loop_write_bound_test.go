package relay

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// On the event loop too, a reader that is slow but steady keeps the write
// bound from firing: the bound counts from the last byte the destination
// took, not from when bytes first waited for it. The buffers between the
// loop and the reader are kept small (64 KiB each way), so what the loop
// holds for the client (a pipe, up to 1 MiB) drains only at the reader's
// pace, 32 KiB every 40 ms: 1.3 s for a full pipe against a 1 s bound,
// while the loop waits 40 ms at a time.
func TestLoopWriteBoundSparesSlowReader(t *testing.T) {
	b := newLoopBed(t, LoopOptions{WriteTimeout: time.Second})
	b.onAccept.Store(func(fd int) { _ = rawio.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 64<<10) })
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	_ = client.SetReadBuffer(64 << 10)
	const total = 3 << 20
	took := readSlowly(t, client, backend, total, 32<<10, 40*time.Millisecond)
	t.Logf("read %d bytes in %v", total, took.Round(time.Millisecond))
}
