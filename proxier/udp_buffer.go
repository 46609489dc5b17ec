package proxier

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// maxDatagram fits any UDP payload; the legacy 4 KiB buffer truncated.
const maxDatagram = 64 * 1024

// oobSpace is the room for a datagram's control messages; pktinfoSpace
// must fit (checked in init).
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

	// Slots [0, queued) hold replies waiting for the service socket's
	// sendmmsg, each addressed to to[i] with replyControl[i].
	queued       int
	to           [udpBatchLen]netip.AddrPort
	replyControl [udpBatchLen][]byte
}

// udpBatches is shared by every UDP socket: per-P caches, so taking and
// returning one takes no lock in the common case. Batches left unused for
// two collections are freed.
var udpBatches = sync.Pool{New: func() any { return newUDPBatch() }}

func init() {
	if pktinfoSpace > oobSpace {
		panic("proxier: oobSpace is smaller than pktinfoSpace")
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
	b.queued = 0
}

// recv reads up to count datagrams queued on the non-blocking socket fd
// into the slots from first on, with their sources when named and up to
// oobLen bytes of control messages each, and returns how many it read
// (fewer than count: the queue is empty now). It is recvmmsg(2) on the
// batch's own headers: the net package's reader cannot be used inside a
// RawConn's callback, and unix.Recvmsg allocates the source address.
func (b *udpBatch) recv(fd, first, count int, named bool, oobLen int) (int, error) {
	for i := first; i < first+count; i++ {
		h := &b.msgs[i].Hdr
		b.iov[i].SetLen(maxDatagram)
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
	return rawio.Recvmmsg(fd, b.msgs[first:first+count])
}

// datagram is what slot i holds.
func (b *udpBatch) datagram(i int) []byte { return b.data[i][:b.msgs[i].Len] }

// controlMessages are the control messages read with slot i's datagram.
func (b *udpBatch) controlMessages(i int) []byte { return b.oob[i][:b.msgs[i].Hdr.Controllen] }

// source decodes the address slot i's datagram came from (IPv4-mapped
// addresses unmapped).
func (b *udpBatch) source(i int) netip.AddrPort {
	sa := &b.name[i]
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), port)
	case unix.AF_INET6:
		addr := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.Scope_id != 0 && addr.Is6() {
			// The interface index as the zone: the net package resolves a
			// numeric zone when sending, and small numbers format without
			// allocating.
			addr = addr.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(addr, port)
	}
	return netip.AddrPort{}
}

// queueReply addresses the datagram in slot b.queued to client, sent from
// a socket of family with the control message control, and makes it part
// of the next sendmmsg. It reports false, queuing nothing, when client
// cannot be written as such a socket's address (an IPv6 client of an
// IPv4 socket, a zone that is not an interface index).
func (b *udpBatch) queueReply(client netip.AddrPort, control []byte, family int) bool {
	i := b.queued
	h := &b.msgs[i].Hdr
	sa := &b.name[i]
	addr := client.Addr()
	switch {
	case family == unix.AF_INET && addr.Is4():
		in := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*in = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: addr.As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&in.Port))[:], client.Port())
		h.Namelen = unix.SizeofSockaddrInet4
	case family == unix.AF_INET6:
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: addr.As16()} // IPv4 as ::ffff:a.b.c.d
		if zone := addr.Zone(); zone != "" {
			id, err := strconv.ParseUint(zone, 10, 32)
			if err != nil {
				return false
			}
			sa.Scope_id = uint32(id)
		}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], client.Port())
		h.Namelen = unix.SizeofSockaddrInet6
	default:
		return false
	}
	h.Name = (*byte)(unsafe.Pointer(sa))
	b.iov[i].SetLen(int(b.msgs[i].Len))
	h.Control = nil
	h.SetControllen(0)
	if len(control) > 0 {
		h.Control = &control[0]
		h.SetControllen(len(control))
	}
	h.Flags = 0
	b.to[i], b.replyControl[i] = client, control
	b.queued++
	return true
}
