package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// checkGSOBurst: a pod sends datagrams to a ClusterIP as one GSO buffer
// (UDP_SEGMENT, as QUIC stacks send). It crosses the pod's veth and the
// portal's DNAT whole, the proxy reads it as one (UDP GRO) and sends it on
// as one GSO buffer; the backend must still get each datagram on its own
// (one answer each, carrying that datagram whole) and every answer must
// come back from the ClusterIP.
func checkGSOBurst(t *testing.T, e *env) {
	const n, size = 8, 1000
	cl := e.pod2(ipGSO)
	dst := e.svcs["gso"].udp()
	u, err := cl.NS.ListenUDPAt(netip.AddrPortFrom(cl.Src, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctl := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])) = size

	for round := range 3 {
		want := map[string]bool{}
		var burst []byte
		for i := range n {
			d := fmt.Sprintf("ECHO round %d datagram %d ", round, i)
			d += strings.Repeat(".", size-len(d))
			want[d] = true
			burst = append(burst, d...)
		}
		if _, _, err := u.WriteMsgUDPAddrPort(burst, ctl, dst); err != nil {
			t.Fatalf("GSO send to %v: %v", dst, err)
		}
		_ = u.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 64<<10)
		for got := 0; got < n; got++ {
			m, from, err := u.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("round %d: %d of %d answers, then %v", round, got, n, err)
			}
			if from.Addr().Unmap() != dst.Addr() || from.Port() != dst.Port() {
				t.Fatalf("round %d: an answer from %v, want %v", round, from, dst)
			}
			line, datagram, ok := strings.Cut(string(buf[:m]), "\n")
			if !ok || !want[datagram] {
				t.Fatalf("round %d: answer %q… (%d bytes) does not carry one datagram sent (%d bytes each)", round, line, m, size)
			}
			delete(want, datagram)
		}
	}
	figure(t, "GSO burst from %s to %s: 3 rounds of %d × %d bytes in one buffer, each datagram answered on its own", cl.Label, dst, n, size)
}
