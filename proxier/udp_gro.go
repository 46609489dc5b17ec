package proxier

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP GRO: a socket with UDP_GRO on takes a run of datagrams of one flow
// and one size the kernel holds together — a GSO send from this node (a
// QUIC stack's, or this proxy's own to a backend here) that crossed
// loopback or a veth whole, or datagrams a NIC's GRO coalesced for a
// connected backend socket — as one buffer with their segment size in a
// UDP_GRO control message, instead of the kernel cutting it into
// datagrams queued one by one. Such a slot is relayed as it came, as one
// GSO buffer with the same segment size; where a datagram must be handled
// alone (faults, GSO refused) it is cut into the datagrams it carries.
// (Traffic a NIC receives for a service address gets no GRO for the
// service socket: GRO looks the socket up by the destination before DNAT.)

// groSpace is the room for a UDP_GRO control message.
var groSpace = unix.CmsgSpace(4)

// enableGRO turns UDP_GRO on for the socket fd and reports whether the
// kernel took it (from Linux 5.0).
func enableGRO(fd int) bool {
	return unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
}

// groSegment returns the segment size a UDP_GRO control message in oob
// gives, 0 when there is none (the read returned one datagram).
func groSegment(oob []byte) int {
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4 {
			return int(*(*int32)(unsafe.Pointer(&data[0])))
		}
		oob = rest
	}
	return 0
}

// datagramAt returns the datagram of slot i that starts at off, and where
// the next one starts: -1 after the last. A slot of one datagram (seg 0)
// is that datagram, even an empty one.
func (b *udpBatch) datagramAt(i, off int) (datagram []byte, next int) {
	end, seg := b.size[i], b.seg[i]
	if seg > 0 && off+seg < end {
		return b.data[i][off : off+seg], off + seg
	}
	return b.data[i][off:end], -1
}

// beyondOwnRuns reports whether slot i is a GRO read larger than the GSO
// buffers this proxy builds itself, in its segments or its whole (an IPv6
// read of up to 65,527 bytes does not fit an IPv4 packet): the kernel
// refusing to send it says nothing about GSO on the socket.
func (b *udpBatch) beyondOwnRuns(i int) bool {
	return b.seg[i] > 0 && (b.seg[i] > gsoMaxSegment || b.size[i] > gsoMaxBuffer)
}
