package proxier

import (
	"net/netip"
	"unsafe"
)

// udpSession is one client ip:port's connected backend socket. It is a few
// hundred bytes and a descriptor: no goroutine and no buffer of its own
// (the reply loop reads replies into a buffer shared by every socket).
// Every field is guarded by the owning socket's mutex.
type udpSession struct {
	client  netip.AddrPort
	backend netip.AddrPort
	// local is where the client's first datagram arrived (the service
	// port's address after the portal's DNAT): what an error to the
	// client quotes (unreachableSender.endpointFailed).
	local netip.AddrPort
	// fd is the connected backend socket, -1 once closed: writers check it
	// under the socket's mutex, so a closed (and perhaps reused) descriptor
	// is never written.
	fd int
	// port is fd's local port (0: unknown), remembered when the session
	// closes so that new sessions pass over it for a while (recentPorts).
	port uint16
	// removed: backend stopped being an endpoint while the session lived.
	// No datagram goes to it any more (the client's next one re-balances),
	// but what it still sends back reaches the client until the session
	// idles out; those replies do not keep the session alive.
	removed bool
	// gro: UDP_GRO is on for fd (asked once its replies came in a burst).
	gro bool
	// replyControlLen is the length of the reply control message held in
	// replyControlBuf (replyControl).
	replyControlLen uint8
	// generation is the service port's endpoint generation when backend was
	// last known to be eligible.
	generation uint64
	// lastActive is when a datagram last passed either way (mono.Now).
	lastActive int64
	// deferredUntil is when the last datagram a fault delayed goes out
	// (mono.Now): the session must outlive it even past the idle timeout.
	deferredUntil int64
	// upDeferredUntil is when the last client datagram a fault delayed
	// goes out to the backend (mono.Now): until then the session is not
	// one to evict at a cap, as that datagram needs its socket (a delayed
	// reply goes out through the service socket and needs none).
	upDeferredUntil int64
	replyControlBuf [replyControlWords]uint64
	// sendUp and sendDown deliver datagrams a fault let through, perhaps
	// later from a timer goroutine; built on the first faulted datagram.
	sendUp, sendDown func([]byte)
	// started (wall clock, UnixNano) and the bytes each way are what
	// /debug/connections shows of the session.
	started           int64
	bytesIn, bytesOut int64

	// newer and older link the table's recency list.
	newer, older *udpSession
}

// replyControl is the control message that makes replies leave from the
// address the client sent to (IP_PKTINFO, putReplyControl); nil when the
// socket is bound to one address. It is the session's own memory (a slice
// field and a buffer of its own were 24 bytes and three allocations more).
func (s *udpSession) replyControl() []byte {
	if s.replyControlLen == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s.replyControlBuf[0])), s.replyControlLen)
}

// udpSessionTable indexes one service port's sessions by client and by
// backend descriptor, and keeps them in order of last activity so that the
// oldest idle one is found in O(1), for expiry and for eviction at the cap.
// It makes no system calls; its owner closes what it removes.
type udpSessionTable struct {
	byClient map[netip.AddrPort]*udpSession
	byFD     map[int32]*udpSession
	newest   *udpSession
	oldest   *udpSession
}

func newUDPSessionTable() udpSessionTable {
	return udpSessionTable{byClient: map[netip.AddrPort]*udpSession{}, byFD: map[int32]*udpSession{}}
}

func (t *udpSessionTable) len() int { return len(t.byClient) }

func (t *udpSessionTable) get(client netip.AddrPort) *udpSession { return t.byClient[client] }

func (t *udpSessionTable) getFD(fd int) *udpSession { return t.byFD[int32(fd)] }

// add inserts s as the most recently active session.
func (t *udpSessionTable) add(s *udpSession, now int64) {
	t.byClient[s.client] = s
	t.byFD[int32(s.fd)] = s
	s.lastActive = now
	t.pushNewest(s)
}

func (t *udpSessionTable) remove(s *udpSession) {
	delete(t.byClient, s.client)
	delete(t.byFD, int32(s.fd))
	t.unlink(s)
}

// touch records activity on s: it becomes the newest.
func (t *udpSessionTable) touch(s *udpSession, now int64) {
	s.lastActive = now
	if t.newest == s {
		return
	}
	t.unlink(s)
	t.pushNewest(s)
}

func (t *udpSessionTable) pushNewest(s *udpSession) {
	s.older, s.newer = t.newest, nil
	if t.newest != nil {
		t.newest.newer = s
	}
	t.newest = s
	if t.oldest == nil {
		t.oldest = s
	}
}

func (t *udpSessionTable) unlink(s *udpSession) {
	if s.newer != nil {
		s.newer.older = s.older
	} else {
		t.newest = s.older
	}
	if s.older != nil {
		s.older.newer = s.newer
	} else {
		t.oldest = s.newer
	}
	s.newer, s.older = nil, nil
}

// each calls fn for every session, oldest first; fn may remove the session
// it is given.
func (t *udpSessionTable) each(fn func(*udpSession)) {
	for s := t.oldest; s != nil; {
		newer := s.newer
		fn(s)
		s = newer
	}
}
