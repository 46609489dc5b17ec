package proxier

import (
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// sendGSO sends datagrams, all but the last of one size (the last no
// longer), on the connected socket c as one UDP_SEGMENT buffer: over
// loopback it reaches a socket with UDP_GRO on whole.
func sendGSO(t testing.TB, c *net.UDPConn, datagrams [][]byte) {
	t.Helper()
	var buf []byte
	for _, d := range datagrams {
		buf = append(buf, d...)
	}
	ctl := appendSegmentSize(nil, len(datagrams[0]))
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sendErr error
	if err := raw.Write(func(fd uintptr) bool {
		_, sendErr = unix.SendmsgN(int(fd), buf, ctl, nil, 0)
		return true
	}); err != nil || sendErr != nil {
		t.Fatal(err, sendErr)
	}
}

// gsoEcho answers every n datagrams it receives with their echoes in one
// GSO buffer, as a QUIC server sends a burst.
func gsoEcho(t testing.TB, n int) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, maxDatagram)
		raw, _ := pc.SyscallConn()
		var got []byte
		for {
			got = got[:0]
			var from netip.AddrPort
			seg := 0
			for i := range n {
				m, f, err := pc.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				if i == 0 {
					seg = m
				}
				got, from = append(got, buf[:m]...), f
			}
			var name unix.RawSockaddrInet6
			namelen, _ := rawio.PutSockaddr(&name, from, unix.AF_INET)
			ctl := appendSegmentSize(nil, seg)
			iov := unix.Iovec{Base: &got[0]}
			iov.SetLen(len(got))
			hdr := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&name)), Namelen: namelen, Iov: &iov, Iovlen: 1, Control: &ctl[0]}
			hdr.SetControllen(len(ctl))
			_ = raw.Write(func(fd uintptr) bool {
				_, _ = rawio.Sendmsg(int(fd), &hdr)
				return true
			})
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// BenchmarkUDPGSOBurst is one round trip of a burst of 16 datagrams of
// 1,200 bytes a client sends as one GSO buffer (as a QUIC stack does),
// answered by a backend that sends its replies as one GSO buffer too:
// "direct" to the backend, "proxied" through a UDP proxy socket. With
// UDP_GRO each buffer crosses the proxy as one read and one send.
func BenchmarkUDPGSOBurst(b *testing.B) {
	const n, size = 16, 1200
	echo := gsoEcho(b, n)
	sock, _ := servedUDPPort(b, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), echo)
	for _, tc := range []struct {
		name string
		to   netip.AddrPort
	}{{"direct", echo}, {"proxied", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(sock.Port()))}} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(tc.to))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			datagrams := make([][]byte, n)
			for i := range datagrams {
				datagrams[i] = make([]byte, size)
			}
			reply := make([]byte, maxDatagram)
			b.SetBytes(n * size)
			var ru0 unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
			for b.Loop() {
				sendGSO(b, c, datagrams)
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				for range n {
					if m, err := c.Read(reply); err != nil || m != size {
						b.Fatalf("reply of %d bytes, %v", m, err)
					}
				}
			}
			var ru1 unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
			cpu := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
