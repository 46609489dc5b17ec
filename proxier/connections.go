package proxier

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/rawio"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// connRegistry is every live proxied TCP connection and UDP session of one
// proxier, for /debug/connections and the -v=4 line at each end.
//
// TCP connections are entries of a sync.Map keyed by the entry's pointer:
// since Go 1.24 that is a concurrent hash-trie whose stores and deletes
// lock one small node, so accepts on different service ports (or the same
// one) never queue on a lock the registry shares. UDP sessions are not
// copied here: each UDP proxy socket already keeps them in its own table,
// so the registry only knows the sockets and reads their tables (under
// each socket's own mutex) when asked.
type connRegistry struct {
	tcp        sync.Map // *liveConn → struct{}
	udpSockets sync.Map // *udpProxySocket → struct{}
	// pending is every goroutine-relayed client not yet in tcp (waiting
	// out a connect_delay, dialling its backend), so that the stop resets
	// it too; stopped: resetAll ran, and no connection starts any more.
	pending pendingClients
	stopped atomic.Bool
}

// pendingClients is a set of clients spread over shards by their port:
// accepts on different cores rarely meet on a lock, and a map reuses its
// slots where a sync.Map allocates an entry for every store.
type pendingClients struct {
	shards [32]struct {
		mu      sync.Mutex
		clients map[*net.TCPConn]struct{}
		_       [48]byte // a cache line each
	}
}

func (pc *pendingClients) add(c *net.TCPConn, from netip.AddrPort) {
	sh := &pc.shards[int(from.Port())%len(pc.shards)]
	sh.mu.Lock()
	if sh.clients == nil {
		sh.clients = map[*net.TCPConn]struct{}{}
	}
	sh.clients[c] = struct{}{}
	sh.mu.Unlock()
}

func (pc *pendingClients) remove(c *net.TCPConn, from netip.AddrPort) {
	sh := &pc.shards[int(from.Port())%len(pc.shards)]
	sh.mu.Lock()
	delete(sh.clients, c)
	sh.mu.Unlock()
}

func (pc *pendingClients) each(f func(*net.TCPConn)) {
	for i := range pc.shards {
		sh := &pc.shards[i]
		sh.mu.Lock()
		for c := range sh.clients {
			f(c)
		}
		sh.mu.Unlock()
	}
}

// liveConn is one registered TCP connection. Everything but the byte
// counts is set before it is registered and never written again.
type liveConn struct {
	reg             *connRegistry
	servicePort     string
	client, backend netip.AddrPort
	started         time.Time
	// faults are the toxics drawn once at accept; toxics is their
	// connection (nil: none), whose faulted directions count what they
	// passed on.
	faults []string
	toxics *faults.Conn
	// clientConn and backendConn give live byte counts through TCP_INFO
	// while the relay's own counts arrive only as a direction ends.
	clientConn, backendConn *net.TCPConn
	// in is client→backend, out backend→client.
	in, out byteCount
	// For drain-removed (lifetime.go): the relay, stored once it exists;
	// the port's balancer entry and lifetime, set before it is; draining
	// marks a connection whose drain time runs.
	relay atomic.Value // quietCloser
	// loop is the connection on the event loops (nil: goroutine relay),
	// whose own counts are live.
	loop     *relay.LoopConn
	sp       *loadbalancer.ServicePort
	lifetime *portLifetime
	draining atomic.Bool
	// untracked is the fault port of a connection that drew no fault,
	// which faults does not track without the fault API (nil: it does, or
	// the socket has no faults), and seq its number there: a down the
	// annotation declares later is cut here (cutDowns). downCut: one cut
	// it already (counted once); beside draining, so that the two share
	// a word (a larger size class cost every connection 32 bytes).
	downCut   atomic.Bool
	untracked *faults.Port
	seq       uint64
}

// byteCount counts one direction of one connection for its service port's
// counter, which gets the bytes while they move, not in one lump at the end
// (a rate() of a long stream would read zero, then a spike): each scrape
// flushes what a live reading shows beyond what was flushed so far, and the
// end adds only what the final count leaves. flushed is what the port has
// from scrapes; the end swaps in flushEnded, so a scrape racing with the
// end adds nothing more (its compare-and-swap fails) and the end nothing
// already added. The data path pays one atomic swap more per direction.
type byteCount struct {
	n       atomic.Int64 // the relay's count, final at the direction's end
	flushed atomic.Int64 // passed on by scrapes; flushEnded once ended
	port    relay.Counter
}

// flushEnded marks a direction whose end settled its port's count.
const flushEnded = -1

// Add takes the direction's count at its end (the relays call it once).
func (b *byteCount) Add(v float64) {
	total := b.n.Add(int64(v))
	switch prior := b.flushed.Swap(flushEnded); {
	case prior == flushEnded: // settled by an earlier Add
		b.port.Add(v)
	case total > prior:
		b.port.Add(float64(total - prior))
	}
	// Otherwise a scrape read more than was finally delivered (bytes
	// received, lost to a reset): a counter is never taken back.
}

// flush passes on what live, the direction's count so far as a scrape
// reads it, shows beyond what was passed on already.
func (b *byteCount) flush(live int64) {
	for {
		prior := b.flushed.Load()
		if prior == flushEnded || live <= prior {
			return
		}
		if b.flushed.CompareAndSwap(prior, live) {
			b.port.Add(float64(live - prior))
			return
		}
	}
}

func (b *byteCount) ended() bool { return b.flushed.Load() == flushEnded }

// addTCP registers a TCP connection once its backend answered. in and out
// are the port's byte counters; the relay counts through the entry's. num
// is its number on its fault port, which keeps it when faults does not
// track it (fc nil: keepUntracked).
func (r *connRegistry) addTCP(servicePort string, client netip.AddrPort, clientConn, backendConn *net.TCPConn, fc *faults.Conn, num faultNumber, in, out relay.Counter) *liveConn {
	c := &liveConn{reg: r, servicePort: servicePort, client: client,
		backend: clientAddr(backendConn.RemoteAddr()), started: time.Now(), faults: fc.Applied(), toxics: fc,
		clientConn: clientConn, backendConn: backendConn}
	c.in.port, c.out.port = in, out
	c.keepUntracked(fc, num)
	if r != nil { // nil: a socket built without a proxier (tests)
		r.tcp.Store(c, struct{}{})
		r.pending.remove(clientConn, client)
		if r.stopped.Load() {
			// resetAll may have ranged over tcp before the Store: the
			// relay then ends at once.
			resetTCP(clientConn)
			resetTCP(backendConn)
		}
	}
	return c
}

// addPending registers a goroutine-relayed client until addTCP does, or
// removePending; false: the proxier stopped (the caller resets it).
func (r *connRegistry) addPending(client *net.TCPConn, from netip.AddrPort) bool {
	if r == nil {
		return true
	}
	r.pending.add(client, from)
	// Loaded after the add: resetAll, which sets stopped before it goes
	// through pending, either sees client or is seen here.
	if r.stopped.Load() {
		r.pending.remove(client, from)
		return false
	}
	return true
}

// removePending forgets a client that ends before its relay starts.
func (r *connRegistry) removePending(client *net.TCPConn, from netip.AddrPort) {
	if r != nil {
		r.pending.remove(client, from)
	}
}

// isStopped reports whether resetAll ran: a connection whose dial
// completes now must not start relaying.
func (r *connRegistry) isStopped() bool { return r != nil && r.stopped.Load() }

// addLoop registers a connection on the event loops once its backend
// answered; fc and num as addTCP's.
func (r *connRegistry) addLoop(servicePort string, client, backend netip.AddrPort, lc *relay.LoopConn, fc *faults.Conn, num faultNumber, in, out relay.Counter) *liveConn {
	c := &liveConn{reg: r, servicePort: servicePort, client: client, backend: backend, started: time.Now(), loop: lc}
	c.in.port, c.out.port = in, out
	c.keepUntracked(fc, num)
	if r != nil {
		r.tcp.Store(c, struct{}{})
	}
	return c
}

// keepUntracked keeps num, c's number on its fault port, for cutDowns when
// faults does not track c (fc nil); one faults tracks (fc) is cut by it.
// The one rule for both data paths.
func (c *liveConn) keepUntracked(fc *faults.Conn, num faultNumber) {
	if fc == nil {
		c.untracked, c.seq = num.port, num.seq
	}
}

// resetAll ends every live goroutine-relayed TCP connection with a reset to
// both peers, as the proxier stops (the event loops' connections are reset
// when their group closes); so too the clients still waiting for their
// backend, whose goroutines then relay nothing (addTCP, isStopped).
func (r *connRegistry) resetAll() {
	r.stopped.Store(true)
	r.pending.each(resetTCP)
	r.tcp.Range(func(k, _ any) bool {
		c := k.(*liveConn)
		if c.loop != nil {
			return true
		}
		resetTCP(c.clientConn)
		resetTCP(c.backendConn)
		return true
	})
}

// faultNumber is a connection's number on its fault port (faults.Port
// NextConn); port nil: the socket has no faults.
type faultNumber struct {
	port *faults.Port
	seq  uint64
}

// cutDowns cuts the live connections of the node that faults does not
// track and that one of downs (a fault port's newly declared down toxics,
// faults.Port.SetDeclared) draws, as faults cuts those it tracks, and
// counts each in faults_injected_total. One walk of the node's
// connections per change that declares a down (the registry is not kept
// per port, so that accepts share no lock).
func (r *connRegistry) cutDowns(downs []faults.Down) {
	if len(downs) == 0 {
		return
	}
	r.tcp.Range(func(k, _ any) bool {
		c := k.(*liveConn)
		if c.untracked == nil {
			return true
		}
		for _, d := range downs {
			if d.Draws(c.untracked, c.seq, c.client.Addr()) {
				c.cutByDown(d)
				break
			}
		}
		return true
	})
}

// cutIfDownSinceAccept cuts a connection that drew no fault if a down in
// force now draws it; call it once the connection is registered. Such a
// down came after its accept (one there then refused it), and its cut
// (cutDowns) may have walked the registry before the connection was in
// it: dialling its backend, it was nowhere to be found. One load of the
// port's faults when it has no down.
func (c *liveConn) cutIfDownSinceAccept() {
	if c.untracked == nil {
		return
	}
	if d, ok := c.untracked.DownDrawing(c.seq, c.client.Addr()); ok {
		c.cutByDown(d)
	}
}

// cutByDown resets both peers of the connection for the down d, unless a
// down did already, and counts it: before the reset, so that a client (or
// a test) that saw it finds it counted.
func (c *liveConn) cutByDown(d faults.Down) {
	if c.downCut.Swap(true) {
		return
	}
	d.Cut()
	if c.loop != nil {
		c.loop.Reset()
	} else {
		resetTCP(c.clientConn)
		resetTCP(c.backendConn)
	}
}

// resetTCP closes conn (nil: none) with a reset to its peer.
func resetTCP(conn *net.TCPConn) {
	if conn != nil {
		_ = conn.SetLinger(0)
		_ = conn.Close()
	}
}

// flush passes the bytes the connection moved since the last scrape on
// to its port's counters: the event loop's own counts; on the goroutine
// relay (whose own counts arrive as a direction ends) what a faulted
// direction's toxics passed on, another's source socket's kernel count.
func (c *liveConn) flush() {
	if c.loop != nil {
		in, out := c.loop.Bytes()
		c.in.flush(in)
		c.out.flush(out)
		return
	}
	up, down := c.toxics.Passed()
	if !c.in.ended() {
		c.in.flush(movedSoFar(up, c.clientConn))
	}
	if !c.out.ended() {
		c.out.flush(movedSoFar(down, c.backendConn))
	}
}

// movedSoFar is a goroutine-relayed direction's count while it runs: what
// its toxics passed on (passed, -1: no toxics), else what its source
// received. Not the kernel's count with toxics: what they dropped (a
// timeout's blackhole) would stay in bytes_total.
func movedSoFar(passed int64, src *net.TCPConn) int64 {
	if passed >= 0 {
		return passed
	}
	return bytesReceived(src)
}

// flush flushes every live TCP connection's bytes (a scrape): O(live
// connections), up to four getsockopt calls for each on the goroutine
// relay.
func (r *connRegistry) flush() {
	r.tcp.Range(func(k, _ any) bool {
		k.(*liveConn).flush()
		return true
	})
}

// end deregisters the connection and logs it at -v=4.
func (c *liveConn) end() {
	if c.reg != nil {
		c.reg.tcp.Delete(c)
	}
	if v := klog.V(4); v.Enabled() {
		logEnd(v, c.debug(time.Now()))
	}
}

func (r *connRegistry) addUDPSocket(s *udpProxySocket) {
	if r != nil {
		r.udpSockets.Store(s, struct{}{})
	}
}

func (r *connRegistry) removeUDPSocket(s *udpProxySocket) {
	if r != nil {
		r.udpSockets.Delete(s)
	}
}

// logUDPSessionEnd logs a session's end at -v=4; s.mu is held.
func logUDPSessionEnd(s *udpProxySocket, sess *udpSession) {
	if v := klog.V(4); v.Enabled() {
		logEnd(v, udpSessionDebug(s, sess, time.Now()))
	}
}

func logEnd(v klog.Verbose, d DebugConnection) {
	v.InfoS("Connection ended", "protocol", d.Protocol, "servicePort", d.ServicePort, "client", d.Client,
		"backend", d.Backend, "bytesFromClient", d.BytesFromClient, "bytesFromBackend", d.BytesFromBackend,
		"age", time.Duration(d.AgeSeconds*float64(time.Second)).Round(time.Millisecond), "faults", d.Faults)
}

// DebugConnection is one row of /debug/connections.
type DebugConnection struct {
	Protocol    string `json:"protocol"`
	ServicePort string `json:"servicePort"`
	Client      string `json:"client"`
	Backend     string `json:"backend"`
	// BytesFromClient went client→backend, BytesFromBackend the other way
	// (while a TCP direction runs: what the proxy received on it so far).
	BytesFromClient  int64     `json:"bytesFromClient"`
	BytesFromBackend int64     `json:"bytesFromBackend"`
	Started          time.Time `json:"started"`
	AgeSeconds       float64   `json:"ageSeconds"`
	// Faults: a TCP connection's toxics drawn at accept; a UDP session's
	// toxics that may act on its datagrams.
	Faults []string `json:"faults,omitempty"`
}

func (c *liveConn) debug(now time.Time) DebugConnection {
	in, out := max(c.in.n.Load(), bytesReceived(c.clientConn)), max(c.out.n.Load(), bytesReceived(c.backendConn))
	if c.loop != nil {
		li, lo := c.loop.Bytes()
		in, out = max(in, li), max(out, lo)
	}
	return DebugConnection{
		Protocol: "TCP", ServicePort: c.servicePort, Client: c.client.String(), Backend: c.backend.String(),
		BytesFromClient:  in,
		BytesFromBackend: out,
		Started:          c.started, AgeSeconds: now.Sub(c.started).Seconds(), Faults: c.faults,
	}
}

// udpSessionDebug is the row of one UDP session; s.mu is held.
func udpSessionDebug(s *udpProxySocket, sess *udpSession, now time.Time) DebugConnection {
	started := time.Unix(0, sess.started)
	d := DebugConnection{
		Protocol: "UDP", ServicePort: s.label, Client: sess.client.String(), Backend: sess.backend.String(),
		BytesFromClient: sess.bytesIn, BytesFromBackend: sess.bytesOut,
		Started: started, AgeSeconds: now.Sub(started).Seconds(),
	}
	if s.faults != nil {
		d.Faults = s.faults.DatagramToxics(sess.client.Addr())
	}
	return d
}

// bytesReceived is the kernel's count of bytes conn received; 0 once the
// relay closed it (its own count is final by then).
func bytesReceived(conn *net.TCPConn) int64 {
	if conn == nil {
		return 0
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0
	}
	var n int64
	_ = raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return
		}
		n = int64(info.Bytes_received)
		// The peer's FIN took a sequence number, which the count
		// includes, and no byte (100,001 for 100,000); the states below
		// say it came. The state is read after the count, not taken
		// from info: the kernel reads info's before it locks the socket
		// for the count, so a FIN that came between was counted with
		// ESTABLISHED (or FIN_WAIT). Read after, it makes the count one
		// low when the FIN came after the count, or at a reset's CLOSE
		// (no FIN): the safe side, as the relay's count, final at the
		// end, makes it up, while one high would stay in bytes_total.
		// (Past FIN_WAIT2 the peer's FIN makes it CLOSE: the socket
		// hands over to a time-wait one.)
		switch rawio.TCPState(int(fd)) {
		case rawio.TCPCloseWait, rawio.TCPLastAck, rawio.TCPClosing, rawio.TCPClose:
			n = max(n-1, 0)
		}
	})
	return n
}

// DebugConnections lists the live connections and UDP sessions, by service
// port, oldest first.
func (p *Proxier) DebugConnections() []DebugConnection {
	now := time.Now()
	out := []DebugConnection{}
	p.sockCfg.conns.tcp.Range(func(k, _ any) bool {
		out = append(out, k.(*liveConn).debug(now))
		return true
	})
	p.sockCfg.conns.udpSockets.Range(func(k, _ any) bool {
		s := k.(*udpProxySocket)
		s.mu.Lock()
		s.sessions.each(func(sess *udpSession) { out = append(out, udpSessionDebug(s, sess, now)) })
		s.mu.Unlock()
		return true
	})
	slices.SortFunc(out, func(a, b DebugConnection) int {
		return cmp.Or(cmp.Compare(a.ServicePort, b.ServicePort), a.Started.Compare(b.Started), cmp.Compare(a.Client, b.Client))
	})
	return out
}

// ConnectionsHandler serves DebugConnections: JSON, or an aligned text
// table for ?format=text or a request that accepts text/plain.
func (p *Proxier) ConnectionsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conns := p.DebugConnections()
		if r.URL.Query().Get("format") == "text" || strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			writeConnectionsText(w, conns)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(conns)
	})
}

func writeConnectionsText(w http.ResponseWriter, conns []DebugConnection) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tSERVICE PORT\tCLIENT\tBACKEND\tFROM CLIENT\tFROM BACKEND\tAGE\tFAULTS")
	for _, c := range conns {
		names := make([]string, len(c.Faults))
		for i, name := range c.Faults {
			names[i] = textField(name)
		}
		f := strings.Join(names, ",")
		if f == "" {
			f = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d B\t%d B\t%s\t%s\n", c.Protocol, textField(c.ServicePort), textField(c.Client), textField(c.Backend),
			c.BytesFromClient, c.BytesFromBackend, time.Duration(c.AgeSeconds*float64(time.Second)).Round(time.Millisecond), f)
	}
	_ = tw.Flush()
}

// textField is s as the text table writes it: quoted when it holds
// anything not printable, so that no value read into it (a toxic name,
// validated elsewhere) can move the terminal's cursor, clear it, or end
// the row and forge another.
func textField(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
