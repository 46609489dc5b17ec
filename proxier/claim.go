package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netaddr"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
)

// claim holds the NodePort (in the families it is served in), and the port
// on external IPs that are local to this node, as the legacy proxier did: the kernel then refuses them to
// any other process, instead of that process silently losing its traffic
// to our portal rules. A held TCP port is bound but not listening, so a
// connection the portals do not catch (a NodePort on an address outside
// --nodeport-addresses) is refused with a reset instead of completing its
// handshake into a backlog nobody accepts from. A held UDP port answers
// what reaches it with port unreachable (see holdUDPPort).
func (p *Proxier) claim(info *servicePortInfo) (closers []func() error, all bool) {
	all = true
	hold := func(ip netip.Addr, port int) {
		// A held port is a descriptor of the sync's budget, as a proxy
		// socket is: held past it, they took the descriptors kept for
		// connections, and every client was reset.
		if err := p.fds.takeN(1); err != nil {
			if p.fds.logged(err) {
				klog.ErrorS(err, "Cannot claim port; no descriptor to spare (retried)", "servicePort", info.name, "address", claimAddress(ip), "port", port)
			}
			all = false
			return
		}
		var c func() error
		var err error
		if info.name.Protocol == v1.ProtocolUDP {
			c, err = holdUDPPort(ip, port, p.sockCfg.unreachable)
		} else {
			c, err = holdTCPPort(ip, port)
		}
		if err != nil {
			p.fds.giveBackN(1)
			holder := "another process holds it"
			if p.ports.handedOut(port) {
				// --proxy-port-range over node ports, with no free port to
				// move our socket to (canMove).
				holder = "a proxy socket of ours holds it (--proxy-port-range has no free port to move it to)"
			}
			klog.ErrorS(err, "Cannot claim port; "+holder, "servicePort", info.name, "address", claimAddress(ip), "port", port)
			all = false
			return
		}
		closers = append(closers, c)
	}
	if info.nodePort != 0 {
		// In the families the NodePort is served in: an IPv6-only
		// Service's held IPv4 port swallowed IPv4 datagrams, which
		// otherwise get the kernel's port unreachable.
		switch v4, v6 := info.nodePortFamilies(true, true); {
		case v4 && v6:
			hold(netip.Addr{}, info.nodePort)
		case v6:
			hold(netip.IPv6Unspecified(), info.nodePort)
		default:
			hold(netip.IPv4Unspecified(), info.nodePort)
		}
	}
	for _, ip := range info.externalIPs {
		if isLocalAddress(ip) {
			hold(ip, info.port)
		}
	}
	return closers, all
}

// claimPorts holds ap's ports (its claims are released), and reports
// whether it holds them all; one another process holds is tried again by
// the sync's retry and every later sync (activePort.claimsMissing), so the
// port is held once that process lets it go (a proxy being replaced, in a
// rolling update that overlaps).
func (p *Proxier) claimPorts(ap *activePort) bool {
	claims, all := p.claim(ap.info)
	ap.claims, ap.claimsMissing = claims, !all
	return all
}

// holdTCPPort binds ip:port (every address, both families, when ip is
// invalid) without listening. No SO_REUSEADDR: with it on both sides the
// kernel would let another process bind and listen on a port held by a
// socket that is not listening (Go's listeners all set it).
func holdTCPPort(ip netip.Addr, port int) (func() error, error) {
	var fd int
	var err error
	switch {
	case !ip.IsValid():
		fd, err = boundTCPSocket(unix.AF_INET6, &unix.SockaddrInet6{Port: port}, false)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			fd, err = boundTCPSocket(unix.AF_INET, &unix.SockaddrInet4{Port: port}, false)
		}
	case ip.Is4() || ip.Is4In6():
		fd, err = boundTCPSocket(unix.AF_INET, &unix.SockaddrInet4{Port: port, Addr: ip.Unmap().As4()}, false)
	default:
		fd, err = boundTCPSocket(unix.AF_INET6, &unix.SockaddrInet6{Port: port, Addr: ip.As16()}, true)
	}
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", net.JoinHostPort(claimAddress(ip), strconv.Itoa(port)), err)
	}
	return func() error { return unix.Close(fd) }, nil
}

// claimAddress names a claim's address for messages: a NodePort's claim has
// none (every address), which netip would print as "invalid IP".
func claimAddress(ip netip.Addr) string {
	if !ip.IsValid() {
		return "*"
	}
	return ip.String()
}

func boundTCPSocket(family int, sa unix.Sockaddr, v6only bool) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family == unix.AF_INET6 {
		only := 0
		if v6only {
			only = 1
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, only); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// holdUDPPort binds ip:port (every address, both families, when ip is
// invalid; an unspecified address takes its own family only). What reaches
// it no portal caught (an address outside --nodeport-addresses, or ::1,
// which no NodePort rule takes): refuse answers it with port unreachable,
// as the kernel answers a port nobody holds and a held TCP port refuses a
// connect. It was taken and dropped, and the client waited out its
// timeouts.
func holdUDPPort(ip netip.Addr, port int, refuse *unreachableSender) (func() error, error) {
	network, addr := "udp", fmt.Sprintf(":%d", port)
	if ip.IsValid() {
		network, addr = "udp6", netip.AddrPortFrom(ip, uint16(port)).String()
		if ip.Unmap().Is4() {
			network = "udp4"
		}
	}
	pc, err := listenConfig.ListenPacket(context.Background(), network, addr)
	if err != nil {
		return nil, err
	}
	// Not connected, which would have made the kernel refuse for us: a
	// connected socket's bound address narrows to the route's source
	// (loopback, for a loopback peer), and every other address would be
	// free to take.
	conn := pc.(*net.UDPConn)
	if refuse != nil {
		if _, err := enableDestinationInfo(conn); err != nil {
			conn.Close()
			return nil, err
		}
		go refuseHeldDatagrams(conn, refuse)
	}
	return conn.Close, nil
}

// heldRefusePause is how long a held UDP port stops reading once the
// errors the whole proxier may send are spent (unreachableRate): a flood
// from many sources then fills the socket's buffer and the kernel drops
// the rest, as it did before held ports answered, where reading every
// datagram only to find nobody could be answered cost half a core at
// 160,000 datagrams a second. A datagram in between is answered late or,
// under such a flood, not at all. A flood from one source, whose own
// errors are spent, is read on (in batches: heldReadBatch): stopping for
// it filled the buffer with its datagrams, and every other client's was
// dropped unanswered while one source sent more than 50 a second.
// In ns (tests lengthen it; other tests' held ports may read it meanwhile).
var heldRefusePause atomic.Int64

func init() { heldRefusePause.Store(int64(20 * time.Millisecond)) }

// heldReadBatch is how many datagrams a held UDP port reads in one
// recvmmsg: a flood it reads on costs a system call per batch, not per
// datagram.
const heldReadBatch = 32

// heldReads are the headers of a held port's batch read. Each datagram is
// read into the same single byte with MSG_TRUNC (its length is all the
// error needs); pooled, taken while datagrams are queued, so an idle held
// port keeps no buffer.
type heldReads struct {
	msgs [heldReadBatch]rawio.Mmsghdr
	iov  unix.Iovec
	name [heldReadBatch]unix.RawSockaddrInet6
	oob  []byte // heldReadBatch slots of pktinfoSpace
	one  [1]byte
}

var heldReadsPool = sync.Pool{New: func() any {
	r := &heldReads{oob: make([]byte, heldReadBatch*pktinfoSpace)}
	r.iov.Base = &r.one[0]
	r.iov.SetLen(1)
	return r
}}

// recv reads up to heldReadBatch datagrams from the non-blocking fd.
func (r *heldReads) recv(fd int) (int, error) {
	for i := range r.msgs {
		h := &r.msgs[i].Hdr
		h.Iov = &r.iov
		h.SetIovlen(1)
		h.Name, h.Namelen = (*byte)(unsafe.Pointer(&r.name[i])), unix.SizeofSockaddrInet6
		h.Control = &r.oob[i*pktinfoSpace]
		h.SetControllen(pktinfoSpace)
		h.Flags = 0
	}
	return rawio.RecvmmsgFlags(fd, r.msgs[:], unix.MSG_TRUNC)
}

// refuseHeldDatagrams answers each datagram that reaches the held conn
// with port unreachable (within the sender's rates), until conn is closed.
// It reads only a datagram's length, source and destination.
func refuseHeldDatagrams(conn *net.UDPConn, refuse *unreachableSender) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return
	}
	bound := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	for {
		var r *heldReads
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			if r == nil {
				r = heldReadsPool.Get().(*heldReads)
			}
			if n, rerr = r.recv(int(fd)); rerr == unix.EAGAIN {
				heldReadsPool.Put(r)
				r = nil
				return false
			}
			return true
		})
		if err != nil {
			if r != nil {
				heldReadsPool.Put(r)
			}
			return // closed
		}
		if rerr == unix.EINTR {
			heldReadsPool.Put(r)
			continue
		}
		if rerr != nil {
			heldReadsPool.Put(r)
			return // the port stays held, its datagrams dropped
		}
		spent := false
		for i := range n {
			client := rawio.AddrPortOf(&r.name[i])
			if !client.IsValid() {
				continue
			}
			// send's steps, with the datagram's length where send takes
			// the datagram itself (only its length goes into the error).
			oob := r.oob[i*pktinfoSpace:][:r.msgs[i].Hdr.Controllen]
			local := datagramDestination(oob, bound)
			ok, globalSpent := refuse.allowOrSpent(client.Addr(), local)
			if globalSpent {
				spent = true
				break
			}
			if !ok {
				continue // this source's errors are spent; others' are not
			}
			refuse.sendTo(client, local, int(r.msgs[i].Len), nil)
		}
		heldReadsPool.Put(r)
		if spent {
			time.Sleep(time.Duration(heldRefusePause.Load()))
		}
	}
}

func (p *Proxier) releaseClaims(ap *activePort) {
	for _, c := range ap.claims {
		_ = c()
	}
	ap.claims = nil
}

// isLocalAddress reports whether ip is this node's (false when the
// interfaces cannot be listed: nothing is claimed then).
func isLocalAddress(ip netip.Addr) bool {
	local, _ := netaddr.IsLocal(ip)
	return local
}
