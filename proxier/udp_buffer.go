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

// udpReadBuf is where a UDP socket's datagrams are read: one datagram, its
// control messages, its source address and the recvmsg header pointing at
// them (built once, so a read allocates nothing).
//
// A socket holds one only while it drains what the kernel has queued, and
// gives it back to udpReadBufs before it waits again: an idle service
// port holds none. Two buffers of maxDatagram per port (service socket and
// reply loop) were 128 KiB of live heap each, 1.28 GB at 10,000 UDP ports,
// which the GC's heap goal then doubled.
type udpReadBuf struct {
	data [maxDatagram]byte
	oob  [oobSpace]byte
	from unix.RawSockaddrInet6 // an IPv4 source fits too
	iov  unix.Iovec
	hdr  unix.Msghdr
}

// udpReadBufs is shared by every UDP socket: per-P caches, so taking and
// returning one takes no lock in the common case. Buffers left unused for
// two collections are freed.
var udpReadBufs = sync.Pool{New: func() any { return newUDPReadBuf() }}

func init() {
	if pktinfoSpace > oobSpace {
		panic("proxier: oobSpace is smaller than pktinfoSpace")
	}
}

func newUDPReadBuf() *udpReadBuf {
	rb := new(udpReadBuf)
	rb.iov.Base = &rb.data[0]
	rb.iov.SetLen(len(rb.data))
	rb.hdr.Iov = &rb.iov
	rb.hdr.SetIovlen(1)
	rb.hdr.Name = (*byte)(unsafe.Pointer(&rb.from))
	return rb
}

func getUDPReadBuf() *udpReadBuf   { return udpReadBufs.Get().(*udpReadBuf) }
func putUDPReadBuf(rb *udpReadBuf) { udpReadBufs.Put(rb) }

// recvmsg reads one datagram from the non-blocking socket fd into rb.data,
// with up to oobLen bytes of control messages into rb.oob, and returns its
// length, the control messages' length and its source (IPv4-mapped
// addresses unmapped). It is recvmsg(2) on rb's own header: the net
// package's reader cannot be used inside a RawConn's callback, and
// unix.Recvmsg allocates the source address.
func (rb *udpReadBuf) recvmsg(fd, oobLen int) (n, oobn int, from netip.AddrPort, err error) {
	rb.hdr.Namelen = unix.SizeofSockaddrInet6
	rb.hdr.Control = nil
	rb.hdr.SetControllen(0)
	if oobLen > 0 {
		rb.hdr.Control = &rb.oob[0]
		rb.hdr.SetControllen(oobLen)
	}
	r, err := rawio.Recvmsg(fd, &rb.hdr)
	if err != nil {
		return 0, 0, netip.AddrPort{}, err
	}
	return r, int(rb.hdr.Controllen), rb.source(), nil
}

// source decodes the raw source address recvmsg left in rb.from.
func (rb *udpReadBuf) source() netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&rb.from.Port))[:])
	switch rb.from.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rb.from))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	case unix.AF_INET6:
		addr := netip.AddrFrom16(rb.from.Addr).Unmap()
		if rb.from.Scope_id != 0 && addr.Is6() {
			// The interface index as the zone: the net package resolves a
			// numeric zone when sending, and small numbers format without
			// allocating.
			addr = addr.WithZone(strconv.FormatUint(uint64(rb.from.Scope_id), 10))
		}
		return netip.AddrPortFrom(addr, port)
	}
	return netip.AddrPort{}
}
