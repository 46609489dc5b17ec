package proxier

import (
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// maxDatagram fits any UDP payload; the legacy 4 KiB buffer truncated.
const maxDatagram = 64 * 1024

// oobSpace is the room for a datagram's control messages; pktinfoSpace,
// groSpace and hopLimitSpace must fit (checked in init).
const oobSpace = 128

// udpBatchLen is how many datagrams one recvmmsg or sendmmsg moves. Under
// make bench's UDP load (16 clients, 4 datagrams in flight each) a wake-up
// finds a few to a dozen replies ready; 16 slots take them in one call.
const udpBatchLen = 16

// udpBatch is where a UDP service port's datagrams are read and its
// replies sent from: udpBatchLen slots, each with a whole datagram, its
// control messages, its peer's address and the header recvmmsg(2) and
// sendmmsg(2) use (built once, so neither allocates). A wake-up reads the
// client datagrams queued on the service socket with one recvmmsg, and
// the replies of every ready backend socket into the slots, sent back to
// their clients with one sendmmsg: per datagram, one read and one send
// instead of a read, a send and a last read that says EAGAIN.
//
// A socket holds one only for one wake-up and gives it back to
// udpBatches before it waits again: an idle service port holds none. (Two
// 64 KiB buffers per port, kept for life, were 1.28 GB of live heap at
// 10,000 UDP ports.)
type udpBatch struct {
	data [udpBatchLen][maxDatagram]byte
	oob  [udpBatchLen][oobSpace]byte
	name [udpBatchLen]unix.RawSockaddrInet6 // an IPv4 address fits too
	iov  [udpBatchLen]unix.Iovec
	msgs [udpBatchLen]rawio.Mmsghdr

	// size is each slot's length (msgs[i].Len is a message's, once
	// messages are built); seg is the segment size of a slot a GRO read
	// filled with several datagrams (udp_gro.go), 0 for one datagram.
	size, seg [udpBatchLen]int
	// groReads counts the slots GRO reads filled in this wake-up.
	groReads int
	// segmentCtl holds the UDP_SEGMENT control message of sendRun.
	segmentCtl [32]byte

	// Replies waiting for the service socket's sendmmsg: slots [0, used)
	// hold them, in queued messages. Message k is msgs[k], addressed to
	// to[k] from replyControl[k]; it carries slots [first[k],
	// first[k]+count[k]): one datagram, or several of one size to one
	// client sent as one UDP GSO buffer (a UDP_SEGMENT control message
	// after the reply's own in oob[k]).
	queued, used int
	to           [udpBatchLen]netip.AddrPort
	replyControl [udpBatchLen][]byte
	first, count [udpBatchLen]int
}

// A GSO buffer's segments must each fit the path MTU (else EINVAL) and the
// whole an IP packet: runs of replies are grouped only up to these sizes
// (1232 bytes fit an IPv6 path of the minimum MTU, 1280).
const (
	gsoMaxSegment = 1232
	gsoMaxBuffer  = 60000
)

// udpBatches is shared by every UDP socket: per-P caches, so taking and
// returning one takes no lock in the common case. Batches left unused for
// two collections are freed.
var udpBatches = sync.Pool{New: func() any { return newUDPBatch() }}

func init() {
	if pktinfoSpace+groSpace+hopLimitSpace > oobSpace {
		panic("proxier: oobSpace is smaller than pktinfoSpace+groSpace+hopLimitSpace")
	}
}

func newUDPBatch() *udpBatch {
	b := new(udpBatch)
	for i := range b.msgs {
		b.iov[i].Base = &b.data[i][0]
		b.msgs[i].Hdr.Iov = &b.iov[i]
		b.msgs[i].Hdr.SetIovlen(1)
	}
	return b
}

func getUDPBatch() *udpBatch { return udpBatches.Get().(*udpBatch) }

func putUDPBatch(b *udpBatch) {
	b.dropReplies()
	udpBatches.Put(b)
}

// dropReplies empties the reply queue, keeping no session's control
// message alive.
func (b *udpBatch) dropReplies() {
	clear(b.replyControl[:b.queued])
	b.queued, b.used = 0, 0
}

// recv reads up to count datagrams queued on the non-blocking socket fd
// into the slots from first on, with their sources when named and up to
// oobLen bytes of control messages each, and returns how many slots it
// filled (fewer than count: the queue is empty now). On a socket with
// UDP_GRO a slot may hold several datagrams: seg says so. It is recvmmsg(2) on the
// batch's own headers: the net package's reader cannot be used inside a
// RawConn's callback, and unix.Recvmsg allocates the source address.
func (b *udpBatch) recv(fd, first, count int, named bool, oobLen int) (int, error) {
	for i := first; i < first+count; i++ {
		h := &b.msgs[i].Hdr
		b.iov[i].SetLen(maxDatagram)
		h.Iov = &b.iov[i] // a queued GSO message pointed it at a run of slots
		h.SetIovlen(1)
		h.Name, h.Namelen = nil, 0
		if named {
			h.Name, h.Namelen = (*byte)(unsafe.Pointer(&b.name[i])), unix.SizeofSockaddrInet6
		}
		h.Control = nil
		h.SetControllen(0)
		if oobLen > 0 {
			h.Control = &b.oob[i][0]
			h.SetControllen(oobLen)
		}
		h.Flags = 0
	}
	n, err := rawio.Recvmmsg(fd, b.msgs[first:first+count])
	for i := first; i < first+n; i++ {
		b.size[i], b.seg[i] = int(b.msgs[i].Len), 0
		if oobLen > 0 {
			if seg := groSegment(b.controlMessages(i)); seg > 0 && seg < b.size[i] {
				b.seg[i] = seg
				b.groReads++
			}
		}
	}
	return n, err
}

// segment is the size of slot i's datagrams: the GRO segment size, or its
// one datagram's.
func (b *udpBatch) segment(i int) int {
	if b.seg[i] > 0 {
		return b.seg[i]
	}
	return b.size[i]
}

// isGSO reports whether queued message k is a GSO buffer.
func (b *udpBatch) isGSO(k int) bool { return b.count[k] > 1 || b.seg[b.first[k]] > 0 }

// controlMessages are the control messages read with slot i's datagram.
func (b *udpBatch) controlMessages(i int) []byte { return b.oob[i][:b.msgs[i].Hdr.Controllen] }

// source decodes the address slot i's datagram came from (IPv4-mapped
// addresses unmapped).
func (b *udpBatch) source(i int) netip.AddrPort { return rawio.AddrPortOf(&b.name[i]) }

// queueReplies queues the replies in slots [b.used, b.used+n), all to
// client, for the next sendmmsg through a socket of family, sent from the
// control message control: as one message each, or, with gso, runs of
// replies of one size (the last may be shorter) as one GSO buffer each.
// A slot a GRO read filled is a GSO buffer of its own.
// It reports false, queuing nothing, when client cannot be written as such
// a socket's address (an IPv6 client of an IPv4 socket, a zone that is not
// an interface index), or when a slot holds several datagrams and gso is
// off: those must leave one by one.
func (b *udpBatch) queueReplies(n int, client netip.AddrPort, control []byte, family int, gso bool) bool {
	var name unix.RawSockaddrInet6
	namelen, ok := rawio.PutSockaddr(&name, client, family)
	if !ok {
		return false
	}
	end := b.used + n
	if !gso {
		for i := b.used; i < end; i++ {
			if b.seg[i] > 0 {
				return false
			}
		}
	}
	for i := b.used; i < end; {
		seg, j := b.segment(i), i+1
		if gso {
			j = b.runEnd(i, end)
		}
		k := b.queued
		h := &b.msgs[k].Hdr
		b.name[k] = name
		h.Name, h.Namelen = (*byte)(unsafe.Pointer(&b.name[k])), namelen
		for x := i; x < j; x++ {
			b.iov[x].SetLen(b.size[x])
		}
		h.Iov = &b.iov[i]
		h.SetIovlen(j - i)
		ctl := control
		if j-i > 1 || b.seg[i] > 0 {
			ctl = appendSegmentSize(append(b.oob[k][:0], control...), seg)
		}
		h.Control = nil
		h.SetControllen(0)
		if len(ctl) > 0 {
			h.Control = &ctl[0]
			h.SetControllen(len(ctl))
		}
		h.Flags = 0
		b.to[k], b.replyControl[k], b.first[k], b.count[k] = client, control, i, j-i
		b.queued++
		i = j
	}
	b.used = end
	return true
}

// runEnd returns where the GSO run that starts at slot i ends, at most at
// end: the slots after i of its size, and one shorter one last; i+1 when
// slot i cannot start one, or holds a GRO read's datagrams (a run of its
// own, of the sender's segment size). An empty datagram cannot be a
// segment: the kernel would send a run of them as one, or drop one at a
// run's end.
func (b *udpBatch) runEnd(i, end int) int {
	seg, j, total := b.size[i], i+1, b.size[i]
	if seg == 0 || seg > gsoMaxSegment || b.seg[i] > 0 {
		return j
	}
	for j < end && b.size[j] > 0 && b.size[j] <= seg && b.seg[j] == 0 && total+b.size[j] <= gsoMaxBuffer {
		total += b.size[j]
		j++
		if b.size[j-1] < seg {
			break // a shorter one ends a run
		}
	}
	return j
}

// sendRun sends slots [i, j), a run runEnd found, on the connected
// socket fd as one GSO buffer.
func (b *udpBatch) sendRun(fd, i, j int) error {
	for x := i; x < j; x++ {
		b.iov[x].SetLen(b.size[x])
	}
	ctl := appendSegmentSize(b.segmentCtl[:0], b.segment(i))
	hdr := unix.Msghdr{Iov: &b.iov[i], Control: &ctl[0]}
	hdr.SetIovlen(j - i)
	hdr.SetControllen(len(ctl))
	_, err := rawio.Sendmsg(fd, &hdr)
	return err
}

// appendSegmentSize appends the UDP_SEGMENT control message that makes the
// kernel cut a send into datagrams of size bytes.
func appendSegmentSize(b []byte, size int) []byte {
	off := len(b)
	b = append(b, make([]byte, unix.CmsgSpace(2))...)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[off]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[off+unix.CmsgLen(0)])) = uint16(size)
	return b
}
