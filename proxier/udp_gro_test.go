package proxier

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// sendGSOBursts sends rounds of n datagrams of size bytes (the last
// shorter) through sock as one GSO buffer each and checks that every echo
// comes back as the datagram it was.
func sendGSOBursts(t *testing.T, sock *udpProxySocket, n, size, rounds int, between func()) {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sock.Port()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for r := range rounds {
		want := map[string]bool{}
		datagrams := make([][]byte, n)
		for i := range n {
			msg := fmt.Sprintf("round %03d datagram %03d ", r, i)
			msg += strings.Repeat("g", size-len(msg))
			if i == n-1 {
				msg = msg[:100]
			}
			want[msg] = true
			datagrams[i] = []byte(msg)
		}
		sendGSO(t, c, datagrams)
		expectEach(t, c, r, want)
		if between != nil {
			between()
		}
	}
}

// expectEach reads as many datagrams from c as want holds and fails
// unless each is one of them, once (round r names the failure).
func expectEach(t *testing.T, c net.Conn, r int, want map[string]bool) {
	t.Helper()
	reply := make([]byte, maxDatagram)
	n := len(want)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range n {
		m, err := c.Read(reply)
		if err != nil {
			t.Fatalf("round %d: %d of %d replies, then %v", r, n-len(want), n, err)
		}
		if !want[string(reply[:m])] {
			t.Fatalf("round %d: a reply of %d bytes that is not one of the datagrams sent, or came twice (%.40q)", r, m, reply[:m])
		}
		delete(want, string(reply[:m]))
	}
}

// A client's GSO buffer reaches the service socket whole (UDP_GRO) and
// goes to the backend as a GSO buffer of the same segment size; the
// backend's GSO reply reaches the backend socket whole and goes back the
// same way; each end gets the datagrams that were sent, one by one.
func TestUDPGROReadsRelayEachDatagram(t *testing.T) {
	const n, rounds = 10, 20
	sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), gsoEcho(t, n))
	sendGSOBursts(t, sock, n, 1000, rounds, nil)
	sock.Close()
	<-served
	// Both ways, each round but the first two at most: the service
	// socket may be read before Serve turned GRO on, and a backend socket
	// asks for it once its replies came several at a time.
	if sock.groReads < 2*(rounds-2) {
		t.Fatalf("%d reads held several datagrams in %d rounds of GSO buffers both ways, want at least %d", sock.groReads, rounds, 2*(rounds-2))
	}
	if sock.gsoSends < rounds || sock.gsoSendsUp < rounds-1 {
		t.Fatalf("%d GSO buffers to the client, %d to the backend in %d rounds, want one each way per round", sock.gsoSends, sock.gsoSendsUp, rounds)
	}
}

// Where GSO is refused, a GRO read's datagrams leave one by one (not as
// one datagram of their sum) both ways.
func TestUDPGROReadsWithGSORefused(t *testing.T) {
	const n, rounds = 10, 10
	sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), gsoEcho(t, n))
	raw, err := sock.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var optErr error
	if err := raw.Control(func(fd uintptr) { optErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) }); err != nil || optErr != nil {
		t.Fatal(err, optErr)
	}
	noChecksums := func() {
		sock.mu.Lock()
		defer sock.mu.Unlock()
		sock.sessions.each(func(sess *udpSession) {
			if err := unix.SetsockoptInt(sess.fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
				t.Error(err)
			}
		})
	}
	sendGSOBursts(t, sock, n, 1000, rounds, noChecksums)
	sock.Close()
	<-served
	if !sock.noGSO || !sock.noGSOUp {
		t.Fatalf("GSO still on after the kernel refused it: to clients %v, to backends %v", !sock.noGSO, !sock.noGSOUp)
	}
	if sock.groReads == 0 {
		t.Fatal("no read held several datagrams")
	}
}

// A faulted port relays each datagram of a GRO read through its plan on
// its own: the sink counts every numbered datagram.
func TestFaultUDPGROReadsGoThroughThePlanOneByOne(t *testing.T) {
	const n = 20
	sink := startUDPSink(t)
	addrs := faultedProxies(t, 0, v1.ProtocolUDP, sink.conn.LocalAddr().String(),
		`[{"type":"latency","stream":"upstream","attributes":{"latency":1}}]`)
	c, err := net.Dial("udp4", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Datagram 0 alone first: once it is relayed, the service socket
	// reads with GRO (Serve turns it on before it reads).
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, 0)); err != nil {
		t.Fatal(err)
	}
	waitGot := func(want int64) {
		deadline := time.Now().Add(5 * time.Second)
		for sink.got.Load() < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGot(1)
	datagrams := make([][]byte, n)
	for i := range datagrams {
		datagrams[i] = make([]byte, 32)
		binary.BigEndian.PutUint32(datagrams[i], uint32(i+1))
	}
	sendGSO(t, c.(*net.UDPConn), datagrams)
	waitGot(n + 1)
	if got := sink.received(); len(got) != n+1 {
		t.Fatalf("the sink got %d datagrams (%v), want %d", len(got), got, n+1)
	}
}

// A slot a GRO read filled is a GSO buffer of its own, of its segment
// size; with GSO off such a slot is not queued at all (its datagrams
// must leave one by one).
func TestUDPGROSlotsQueueAsTheirOwnGSOBuffers(t *testing.T) {
	client := netip.MustParseAddrPort("10.0.0.1:53")
	b := newUDPBatch()
	b.size = [udpBatchLen]int{64, 2500, 64, 64}
	b.seg[1] = 1000
	if !b.queueReplies(4, client, nil, unix.AF_INET, true) {
		t.Fatal("not queued")
	}
	var got [][3]int // per message: slots, segment size (0: none), bytes
	for k := range b.queued {
		seg := 0
		if ctl := unsafe.Slice(b.msgs[k].Hdr.Control, b.msgs[k].Hdr.Controllen); len(ctl) > 0 {
			_, data, _, err := unix.ParseOneSocketControlMessage(ctl)
			if err != nil {
				t.Fatal(err)
			}
			seg = int(*(*uint16)(unsafe.Pointer(&data[0])))
		}
		got = append(got, [3]int{b.count[k], seg, b.size[b.first[k]]})
	}
	if want := [][3]int{{1, 0, 64}, {1, 1000, 2500}, {2, 64, 64}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("messages (slots, segment, first slot's bytes) %v, want %v", got, want)
	}

	b = newUDPBatch()
	b.size[0], b.seg[0] = 2500, 1000
	if b.queueReplies(1, client, nil, unix.AF_INET, false) || b.queued != 0 {
		t.Fatalf("a GRO slot was queued (%d messages) with GSO off", b.queued)
	}
}

// datagramAt cuts a GRO slot at its segment size, the last one shorter;
// a slot of one datagram, even an empty one, is that datagram.
func TestDatagramAtCutsGROSlots(t *testing.T) {
	for _, tc := range []struct {
		size, seg int
		want      []int
	}{
		{2500, 1000, []int{1000, 1000, 500}},
		{2000, 1000, []int{1000, 1000}},
		{50, 0, []int{50}},
		{0, 0, []int{0}},
	} {
		b := newUDPBatch()
		b.size[3], b.seg[3] = tc.size, tc.seg
		var got []int
		for off := 0; off >= 0; {
			var d []byte
			d, off = b.datagramAt(3, off)
			got = append(got, len(d))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("size %d, segment %d: datagrams of %v bytes, want %v", tc.size, tc.seg, got, tc.want)
		}
	}
}

// A refused GSO send of a GRO read larger than the proxy's own runs turns
// GSO off for nothing but that read.
func TestBeyondOwnRuns(t *testing.T) {
	for _, tc := range []struct {
		size, seg int
		want      bool
	}{
		{64, 0, false},                       // one datagram
		{10 * 1000, 1000, false},             // within the proxy's own runs
		{3 * 1400, 1400, true},               // segments above gsoMaxSegment
		{64 * 1000, 1000, true},              // a whole above gsoMaxBuffer
		{gsoMaxBuffer, gsoMaxSegment, false}, // at both bounds
	} {
		b := newUDPBatch()
		b.size[0], b.seg[0] = tc.size, tc.seg
		if got := b.beyondOwnRuns(0); got != tc.want {
			t.Errorf("size %d, segment %d: %v, want %v", tc.size, tc.seg, got, tc.want)
		}
	}
}

// A faulted port's GRO read of replies goes through the plan one datagram
// at a time: the client gets each reply on its own.
func TestFaultUDPGRORepliesGoThroughThePlanOneByOne(t *testing.T) {
	const n, rounds = 8, 4
	addrs := faultedProxies(t, 0, v1.ProtocolUDP, gsoEcho(t, n).String(),
		`[{"type":"latency","stream":"downstream","attributes":{"latency":1}}]`)
	c, err := net.Dial("udp4", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first round's replies reach the backend socket cut (it asks for
	// GRO once they came several at a time); the next ones whole.
	for r := range rounds {
		want := map[string]bool{}
		datagrams := make([][]byte, n)
		for i := range datagrams {
			d := fmt.Sprintf("round %d reply %d ", r, i)
			d += strings.Repeat("f", 500-len(d))
			datagrams[i], want[d] = []byte(d), true
		}
		sendGSO(t, c.(*net.UDPConn), datagrams)
		expectEach(t, c, r, want)
	}
}

// When the kernel refuses a GRO read as one GSO buffer, each way, its
// datagrams go one by one and arrive as they were sent. Segments within
// the proxy's own runs turn GSO off for the socket; larger ones (1,400
// bytes: a path that took less than the sender's) leave it on.
func TestUDPRefusedGROReadsAreCut(t *testing.T) {
	for _, tc := range []struct {
		size       int
		wantGSOOff bool
	}{{1000, true}, {1400, false}} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			const n, rounds = 10, 4
			sock, served := servedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), gsoEcho(t, n))
			raw, err := sock.conn.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			// After the first round: the backend socket reads with GRO
			// (rather than once its replies came several at a time), and
			// both sockets lose the UDP checksums GSO needs.
			once := false
			refuse := func() {
				if once {
					return
				}
				once = true
				sock.mu.Lock()
				sock.sessions.each(func(sess *udpSession) {
					sess.gro = enableGRO(sess.fd)
					if err := unix.SetsockoptInt(sess.fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
						t.Error(err)
					}
				})
				sock.mu.Unlock()
				var optErr error
				if err := raw.Control(func(fd uintptr) { optErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) }); err != nil || optErr != nil {
					t.Fatal(err, optErr)
				}
			}
			sendGSOBursts(t, sock, n, tc.size, rounds, refuse)
			sock.Close()
			<-served
			if sock.noGSO != tc.wantGSOOff || sock.noGSOUp != tc.wantGSOOff {
				t.Fatalf("GSO off to clients %v, to backends %v; want %v both", sock.noGSO, sock.noGSOUp, tc.wantGSOOff)
			}
			if sock.groReads < 2*(rounds-2) {
				t.Fatalf("%d reads held several datagrams, want at least %d", sock.groReads, 2*(rounds-2))
			}
		})
	}
}

// A GSO send to a backend whose port closed meanwhile is refused having
// sent nothing (the ICMP error is pending on the session's socket): the
// GRO read's datagrams all go on, through a new session, not lost with
// the refused buffer.
func TestUDPGROReadRefusedByAClosedBackendIsNotLost(t *testing.T) {
	listen := func(addr string) *net.UDPConn {
		pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		return pc
	}
	backend := listen("127.0.0.2:0")
	addr := backend.LocalAddr().(*net.UDPAddr).AddrPort()
	sock := unservedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), addr)
	client := netip.MustParseAddrPort("127.0.0.9:4000")
	buf := make([]byte, maxDatagram)
	read := func() (string, error) {
		_ = backend.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, err := backend.Read(buf)
		return string(buf[:m]), err
	}
	sock.forward(client, []byte("open"), nil)
	if got, err := read(); err != nil || got != "open" {
		t.Fatalf("the session's first datagram: %q, %v", got, err)
	}
	backend.Close()
	sock.forward(client, []byte("to a closed port"), nil) // its ICMP error waits on the session socket
	time.Sleep(50 * time.Millisecond)
	backend = listen(addr.String())

	b := newUDPBatch()
	var want []string
	for i := range 3 {
		d := fmt.Sprintf("GRO datagram %d ", i)
		d += strings.Repeat("r", 1000-len(d))
		copy(b.data[0][i*1000:], d)
		want = append(want, d)
	}
	b.size[0], b.seg[0] = 3000, 1000
	sock.forwardRun(client, b, 0, 1)
	for _, w := range want {
		got, err := read()
		if err != nil {
			t.Fatalf("the backend got none of the GRO read's datagrams after the refused send: %v", err)
		}
		if got != w {
			t.Fatalf("the backend got %.20q (%d bytes), want %.20q", got, len(got), w)
		}
	}
}

// A single datagram ahead of a GRO read (a QUIC client's small packet
// before its burst), read in one batch, does not make the read go one
// datagram at a time: it is still one GSO buffer to the backend.
func TestUDPGROReadAfterASingleDatagramStaysWhole(t *testing.T) {
	backend, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	sock := unservedUDPPort(t, "udp4", netip.MustParseAddrPort("127.0.0.1:0"), backend.LocalAddr().(*net.UDPAddr).AddrPort())
	client := netip.MustParseAddrPort("127.0.0.9:4000")
	buf := make([]byte, maxDatagram)
	read := func() string {
		_ = backend.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, err := backend.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:m])
	}
	sock.forward(client, []byte("open"), nil)
	read()

	b := newUDPBatch()
	b.size[0] = copy(b.data[0][:], "small")
	want := []string{"small"}
	for i := range 3 {
		d := fmt.Sprintf("burst %d ", i)
		d += strings.Repeat("b", 1000-len(d))
		copy(b.data[1][i*1000:], d)
		want = append(want, d)
	}
	b.size[1], b.seg[1] = 3000, 1000
	sock.forwardRun(client, b, 0, 2)
	for _, w := range want {
		if got := read(); got != w {
			t.Fatalf("the backend got %.20q (%d bytes), want %.20q", got, len(got), w)
		}
	}
	if sock.gsoSendsUp != 1 {
		t.Fatalf("%d GSO sends to the backend, want 1 (the GRO read)", sock.gsoSendsUp)
	}
}
