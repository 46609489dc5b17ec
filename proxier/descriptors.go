package proxier

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/relay"
)

// descriptorBudget keeps the proxy sockets a sync opens from taking the
// last descriptors of RLIMIT_NOFILE: the proxy also needs some for its
// rule writes (iptables-restore's pipes), the health and metrics servers,
// reading the manifests and the connections it relays. With listeners
// alone at the limit (150 Services of TCP and UDP under `ulimit -n 256`),
// every rule write failed, so no Service was served, not even those whose
// sockets opened; nor could the manifests be read again to shed any, nor
// /healthz answer: an outage that lasted until a restart. A socket past the
// budget fails to open, as one whose port is taken does: logged, listed
// in /debug/services, and retried by the sync's retry.
type descriptorBudget struct {
	// count is the descriptors in use and the limit (ok false: unknown,
	// no budget). A variable for tests.
	count func() (inUse, limit int, ok bool)

	// room is what this sync may still open; counted is whether it was
	// counted in this sync (counting costs a read of /proc/self/fd, paid
	// only by a sync that opens something); short, once a count found no
	// room, is the refusal of every socket left in this sync (each of
	// thousands counted twice again).
	room    int
	counted bool
	short   error
	// refused counts this sync's refusals, of which only the first is
	// logged in full: the same error per service port was thousands of
	// lines per retry.
	refused int
}

func newDescriptorBudget() *descriptorBudget { return &descriptorBudget{count: descriptorsInUse} }

// descriptorReserve is what the sockets of a sync leave free of limit,
// and the connections too (setDescriptorCeiling).
func descriptorReserve(limit int) int { return max(64, limit/16) }

// listenerRoom is how many of limit the proxy sockets (and NodePort holds)
// may take: below the connections' ceiling by a further descriptorReserve,
// which connections keep whatever the listeners want. It ended at the
// ceiling, so more service ports than the limit allowed (one Service of
// 3,000 ports under a limit of 2,000) filled it, and every client of every
// Service was reset there.
func listenerRoom(limit int) int { return limit - 2*descriptorReserve(limit) }

// setDescriptorCeiling keeps the connections of both data paths (their
// client and backend sockets, UDP sessions' sockets) out of the top
// descriptorReserve of RLIMIT_NOFILE (relay.InReserve): listeners are held
// a further descriptorReserve below it by the budget (listenerRoom),
// connections by the ceiling, and what stays free
// is for the rule writes, the health and metrics servers and reading the
// manifests, which idle clients took before.
func setDescriptorCeiling() {
	nofile := nofileLimit()
	ceilingLimit.Store(nofile)
	relay.SetDescriptorCeiling(connectionCeiling(int(min(nofile, 1<<30))))
}

// connectionCeiling is how many of limit the connections may number up to.
func connectionCeiling(limit int) int { return limit - descriptorReserve(limit) }

// ceilingLimit is the RLIMIT_NOFILE the ceiling was last set from.
var ceilingLimit atomic.Uint64

// followDescriptorLimit sets the ceiling again, at each sync, when
// RLIMIT_NOFILE changed since it was set (prlimit --pid on the running
// proxy): set once at start, a limit lowered from 20,000 to 64 left the
// ceiling at 18,750, so connections took every descriptor and the metrics
// server could not accept. One getrlimit per sync; an unchanged limit
// leaves the ceiling as it is.
func followDescriptorLimit() {
	if nofileLimit() != ceilingLimit.Load() {
		setDescriptorCeiling()
	}
}

// begin starts a sync: the next take counts again.
func (b *descriptorBudget) begin() { b.counted, b.short, b.refused = false, nil, 0 }

// logged says whether err, a socket's failure to open, is for the log:
// all but the budget's refusals after this sync's first.
func (b *descriptorBudget) logged(err error) bool {
	if b.short == nil || err != b.short {
		return true
	}
	b.refused++
	return b.refused == 1
}

// logRefusals logs, at the end of a sync, how many more proxy sockets the
// budget refused than the one logged.
func (b *descriptorBudget) logRefusals() {
	if b.refused > 1 {
		klog.ErrorS(b.short, "More proxy sockets and NodePort holds not opened for want of descriptors (retried)", "count", b.refused-1)
	}
}

// take accounts for one more socket, or says why none may open. A socket
// is taken to cost socketDescriptors, more than most do, and the room is
// counted again once that estimate runs out: so the budget never lets the
// sockets overrun it, and a sync of 10,000 counts a few times, not once per
// socket.
func (b *descriptorBudget) take() error { return b.takeN(socketDescriptors) }

// takeN is take for something that holds n descriptors: a held NodePort
// (claim.go) holds one.
func (b *descriptorBudget) takeN(n int) error {
	if b.short != nil {
		return b.short
	}
	if !b.counted || b.room < n {
		b.counted = true
		b.room = 1 << 30
		if inUse, limit, ok := b.count(); ok {
			b.room = listenerRoom(limit) - inUse
			if b.room < n {
				b.short = fmt.Errorf("no descriptor to spare: %d of the open-file limit %d in use, and %d kept for rule writes, servers and connections; raise the limit (ulimit -n, systemd's LimitNOFILE)",
					inUse, limit, limit-listenerRoom(limit))
				return b.short
			}
		}
	}
	b.room -= n
	return nil
}

// socketDescriptors is the most a proxy socket holds: a UDP one its
// socket, its poller's epoll and wake-up descriptors.
const socketDescriptors = 4

// giveBack returns what take accounted for a socket that did not open.
func (b *descriptorBudget) giveBack() { b.giveBackN(socketDescriptors) }

// giveBackN returns what takeN accounted.
func (b *descriptorBudget) giveBackN(n int) { b.room += n }

// healthDescriptors lends the sync's budget to the healthCheckNodePort
// servers (healthcheck.Descriptors), which the sync opens before its proxy
// sockets.
type healthDescriptors struct{ b *descriptorBudget }

func (h healthDescriptors) TakeN(n int) error { return h.b.takeN(n) }
func (h healthDescriptors) GiveBackN(n int)   { h.b.giveBackN(n) }

// descriptorsInUse counts this process's open descriptors and reads its
// limit. It reads /proc/self/fd's entries without their names: a sync
// that opens 10,000 sockets counts several times.
func descriptorsInUse() (inUse, limit int, ok bool) {
	fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, false
	}
	defer unix.Close(fd)
	buf := direntBuf.Get().(*[]byte)
	defer direntBuf.Put(buf)
	entries := 0
	for {
		n, err := unix.Getdents(fd, *buf)
		if err != nil {
			return 0, 0, false
		}
		if n <= 0 {
			break
		}
		// linux_dirent64: inode (8), offset (8), record length (2), ...
		for off := 0; off+18 <= n; off += int(binary.NativeEndian.Uint16((*buf)[off+16:])) {
			entries++
		}
	}
	// Less ".", ".." and the descriptor reading them.
	return entries - 3, int(min(nofileLimit(), 1<<30)), true
}

var direntBuf = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
