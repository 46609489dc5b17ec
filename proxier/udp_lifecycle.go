package proxier

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// A UDP proxy socket's sessions: opened at a client's first datagram
// (sessionLocked), room made at the caps (makeRoomLocked, and at the total
// cap roomFromOtherPorts), closed (closeSessionLocked, endSessionLocked)
// and expired (expireIdle).

// errSessionLimit: the port's cap or the total cap is reached and this port
// has no session of its own to give up (none, or none idle: a fault still
// delays a datagram of each it looked at); at the total cap forward then
// asks the ports holding the most (roomFromOtherPorts), and drops the
// datagram only when none of them has one either.
var errSessionLimit = errors.New("UDP session limit reached")

// errPortSessionLimit: the port's own cap is reached and a fault still
// delays a client datagram of each session it looked at (an
// errSessionLimit, said as the port's own).
var errPortSessionLimit = fmt.Errorf("%w (the service port's own, --udp-max-sessions-per-port)", errSessionLimit)

// sessionLocked returns the client's session, opening one (and making room
// for it) on the client's first datagram or when its backend is no longer
// an endpoint.
func (s *udpProxySocket) sessionLocked(client netip.AddrPort, oob []byte, now int64) (*udpSession, error) {
	generation := s.sp.Generation()
	if sess := s.sessions.get(client); sess != nil {
		if s.servedLocked(sess, generation) {
			return sess, nil
		}
		// The endpoint is gone: re-balance now, as kube-proxy deletes the
		// conntrack entries of a removed UDP endpoint.
		s.closeSessionLocked(sess)
	}
	if s.shut {
		return nil, net.ErrClosed
	}
	// The backend socket sends one hop less than the datagram had left
	// (udp_hoplimit.go); 0: not reported.
	hops := hopLimit(oob)
	if hops == 1 {
		return nil, errHopLimitExceeded
	}
	if err := s.makeRoomLocked(now); err != nil {
		return nil, err
	}
	s.cfg.udpPorts.maybeReread(now)
	var lastErr error
	var tried [maxDialAttempts]netip.AddrPort
	failed := tried[:0]
	for range s.cfg.dialTimeouts {
		// After a failure, past the endpoints that failed (affinity
		// moves the client on: its pinned endpoint was the first), as
		// TCP's dial does.
		var ep netip.AddrPort
		var err error
		if len(failed) == 0 {
			ep, err = s.sp.Next(client.Addr(), false)
		} else {
			ep, err = s.sp.Retry(client.Addr(), failed)
		}
		if err == nil {
			ep, failed, err = s.cfg.ownPortals.pass(iptables.UDP, s.sp, s.label, client.Addr(), ep, failed)
		}
		if err != nil {
			lastErr = err
			break
		}
		fd, port, err := dialUDPSession(ep, s.cfg.udpPorts)
		if err == nil {
			if hops > 0 {
				err = setHopLimit(fd, ep.Addr().Unmap().Is4(), hops-1)
			}
			if err == nil {
				err = s.poller.add(fd)
			}
			if err != nil {
				rawio.Close(fd)
			}
		}
		if err != nil {
			lastErr = err
			if relay.LocalShortage(err) {
				break // no endpoint's fault, and the next would fail alike
			}
			s.dialFailures.Inc()
			failed = append(failed, ep)
			continue
		}
		sess := &udpSession{client: client, backend: ep, local: datagramDestination(oob, s.bound), fd: fd, port: port, generation: generation, started: time.Now().UnixNano()}
		if s.replyFromDestination {
			sess.replyControlLen = uint8(len(putReplyControl(&sess.replyControlBuf, oob)))
		}
		s.sessions.add(sess, now)
		s.held.Store(int64(s.sessions.len()))
		s.sessionsGauge.Inc()
		if s.sessions.len() == 1 {
			s.poller.setDeadline(mono.Time(s.idleAt(now)))
		}
		return sess, nil
	}
	s.cfg.udpBudget.release()
	return nil, lastErr
}

// servedLocked reports whether the socket's balancer, at its endpoint
// generation, still serves sess's backend; if so, sess is checked against
// that generation (and no longer removed).
func (s *udpProxySocket) servedLocked(sess *udpSession, generation uint64) bool {
	if sess.generation == generation {
		return true
	}
	if s.sp.Serves(sess.backend) {
		sess.generation, sess.removed = generation, false
		return true
	}
	return false
}

// makeRoomLocked takes a slot for one more session: at the port's cap, or
// at the total cap, the port's oldest idle session gives up its own
// (giveUpOwnLocked). A session whose client's datagram a fault still
// delays is not idle: closed, the datagram found no socket when the delay
// line let it out and was lost, counted nowhere. With none to give up
// among the oldest, it returns errPortSessionLimit at the port's cap (the
// datagram is dropped, counted) and errSessionLimit at the total cap
// (forward asks the other ports: roomFromOtherPorts), as it does there
// when another port holds more sessions than this one. A slot another
// port gave (givenSlot) is taken first.
func (s *udpProxySocket) makeRoomLocked(now int64) error {
	if s.sessions.len() >= s.cfg.udpMaxSessionsPerPort && s.sessions.len() > 0 {
		if !s.giveUpOwnLocked(now) {
			return errPortSessionLimit
		}
		// Its own freed slot is the new session's: one another port
		// gave meanwhile (adopted sessions filled the port) goes back.
		s.returnGivenSlotLocked()
		return nil
	}
	if s.givenSlot {
		s.givenSlot = false
		return nil
	}
	if s.cfg.udpBudget.acquire() {
		return nil
	}
	// The total cap: the port holding the most sessions pays
	// (roomFromOtherPorts), this one first only when no other holds
	// more. Its own first whatever the others held, a port with a few
	// clients closed their sessions, replies still on the way, for each
	// other while a flooded port kept the rest.
	if !s.cfg.udpBudget.holders.anyHoldsMore(s.cfg.conns, s, now) && s.giveUpOwnLocked(now) {
		return nil
	}
	return errSessionLimit
}

// giveUpOwnLocked closes the port's oldest idle session, counted as
// evicted, and keeps its slot in the budget for the session that replaces
// it (false: none of the oldest is idle). Released and taken again, the
// slot could go to another port's new client in between: the port then
// closed a second session for one client, or dropped the client although
// it had closed one for it.
func (s *udpProxySocket) giveUpOwnLocked(now int64) bool {
	old := s.evictableLocked(now)
	if old == nil {
		return false
	}
	s.sessions.remove(old)
	s.held.Store(int64(s.sessions.len()))
	s.freeSessionLocked(old)
	s.evicted.Inc()
	return true
}

// udpEvictScan bounds how many of a port's oldest sessions makeRoomLocked
// looks at for one that no fault holds a datagram of: under a latency
// toxic those are the newest, so the oldest is nearly always one, and a
// port whose every session holds one (more new clients within the delay
// than the cap) costs each new client a bounded walk, not the table's.
const udpEvictScan = 256

// evictableLocked returns the port's oldest session that no fault holds a
// client datagram of (its upDeferredUntil passed), nil when none of the
// udpEvictScan oldest is.
func (s *udpProxySocket) evictableLocked(now int64) *udpSession {
	sess := s.sessions.oldest
	for range udpEvictScan {
		if sess == nil {
			return nil
		}
		if sess.upDeferredUntil <= now {
			return sess
		}
		sess = sess.newer
	}
	return nil
}

func (s *udpProxySocket) closeSessionLocked(sess *udpSession) {
	s.sessions.remove(sess)
	s.held.Store(int64(s.sessions.len()))
	s.endSessionLocked(sess)
}

// endSessionLocked releases what a session holds, once out of the table:
// its backend socket (its local port noted as freed), its slot in the
// session budget, its count in the gauge.
func (s *udpProxySocket) endSessionLocked(sess *udpSession) {
	s.freeSessionLocked(sess)
	s.cfg.udpBudget.release()
}

// freeSessionLocked is endSessionLocked but for the budget slot, which the
// caller passes on.
func (s *udpProxySocket) freeSessionLocked(sess *udpSession) {
	logUDPSessionEnd(s, sess)
	rawio.Close(sess.fd)
	sess.fd = -1
	s.cfg.udpPorts.freed(sess.port)
	s.sessionsGauge.Dec()
}

// roomFromOtherPorts makes room for a new client of s at the total cap
// when another port holds more sessions than s, or s has none idle
// (errSessionLimit from makeRoomLocked): the port holding the most
// sessions gives up its oldest idle one, or the next biggest when none of
// its oldest is idle (a fault delays a datagram of each), and s its own
// after all when none of them has one. It reports whether one did; the closed
// session's slot in the budget is then s's (givenSlot), not released for
// any port's new client to take first. Not the oldest idle session of all
// ports: under a flood of forged sources those are the long-lived clients
// of quiet Services, and the flooded port is the one that pays.
//
// Called without s.mu, and takes one port's mutex at a time: two ports
// each making room from the other at once never wait on each other.
func (s *udpProxySocket) roomFromOtherPorts(now int64) bool {
	for _, other := range s.cfg.udpBudget.holders.biggest(s.cfg.conns, now) {
		if other != nil && other != s && other.giveUpIdle(now) {
			return true
		}
	}
	return s.giveUpIdle(now)
}

// giveUpIdle closes the port's oldest idle session for a new client (of
// another port, or its own: roomFromOtherPorts), counted as evicted, and
// keeps its slot in the budget for that client; false when it has none
// idle or is closed.
func (s *udpProxySocket) giveUpIdle(now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.shut && s.giveUpOwnLocked(now)
}

// takeGivenSlotLocked holds the slot roomFromOtherPorts gave s for its
// next session, or gives it back when s closed meanwhile.
func (s *udpProxySocket) takeGivenSlotLocked() {
	if s.shut {
		s.cfg.udpBudget.release()
		return
	}
	s.givenSlot = true
}

// returnGivenSlotLocked gives back a slot no session of s took (s closes).
func (s *udpProxySocket) returnGivenSlotLocked() {
	if s.givenSlot {
		s.givenSlot = false
		s.cfg.udpBudget.release()
	}
}

// expireIdle closes the sessions idle for udpIdleTimeout (no datagram
// either way and no delayed one pending) and marks those whose backend is
// no longer an endpoint as removed, then sets the next deadline. A removed
// session is not closed at once: a reply to a datagram sent just before
// the endpoint went away would be lost although its backend answered (the
// endpoint's process usually lives on while it terminates, or only left
// the Service). It idles out from the client's last datagram, replies do
// not extend it, and the client's next datagram re-balances.
func (s *udpProxySocket) expireIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return
	}
	now := mono.Now()
	for old := s.sessions.oldest; old != nil && s.idleAt(old.lastActive) <= now; old = s.sessions.oldest {
		if s.idleAt(old.deferredUntil) > now {
			// A datagram a fault delayed is still to go out, or left less
			// than the idle timeout ago: its answer must find the session.
			// Re-touched only while the delay was ahead, the session lived
			// 0 to --udp-timeout after the datagram left, and a check
			// between its due time and the delay line's send closed the
			// session before the datagram could go out.
			s.sessions.touch(old, now)
			continue
		}
		s.closeSessionLocked(old)
	}
	if generation := s.sp.Generation(); generation != s.checkedGeneration {
		s.checkedGeneration = generation
		s.sessions.each(func(sess *udpSession) {
			if !s.servedLocked(sess, generation) {
				sess.removed = true
			}
		})
	}
	if old := s.sessions.oldest; old != nil {
		s.poller.setDeadline(mono.Time(s.idleAt(old.lastActive)))
	} else {
		s.poller.setDeadline(time.Time{})
	}
}

// idleAt is when a session last active at lastActive idles out (mono.Now
// time). It saturates: a --udp-timeout near the largest duration ("never")
// wrapped into the past, and every session closed as it opened.
func (s *udpProxySocket) idleAt(lastActive int64) int64 {
	return mono.Add(lastActive, s.cfg.udpIdleTimeout)
}
