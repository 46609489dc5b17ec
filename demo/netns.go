package demo

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// The throw-away network of demo --netns: two namespaces joined by a veth.
//
//	client namespace                          node namespace
//	eth0: 10.77.0.11, .12, .21-.32, ...  ──── vc0: 10.77.0.1   (the node IP)
//	default route via 10.77.0.1               lo: 10.244.0.11-13 (the backends)
//	                                          kube-userspace-proxy, iptables portals
//
// The clients reach the Services' ClusterIPs (10.96.0.x) through the node,
// whose PREROUTING portal rules DNAT them to the proxy sockets on the node
// IP, as on a real node. Nothing is created outside the two namespaces, and
// deleting them removes every address, rule and conntrack entry with them.
var (
	demoNodeIP    = [4]byte{10, 77, 0, 1}
	demoClientNet = [3]byte{10, 77, 0}
	demoPodIPs    = []string{"10.244.0.11", "10.244.0.12", "10.244.0.13"}
)

// netNS is one namespace, by its `ip netns` name.
type netNS struct{ name string }

// ip runs `ip -n NAME args...`.
func (n netNS) ip(args ...string) error {
	return run("ip", append([]string{"-n", n.name}, args...)...)
}

// exec runs a command inside the namespace and returns its output.
func (n netNS) exec(name string, args ...string) ([]byte, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name, name}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
	}
	return out, err
}

// do runs fn on an OS thread that has joined the namespace. Sockets fn
// opens belong to the namespace for good and may be used from any
// goroutine. The thread is never handed back to the Go scheduler (the
// goroutine ends still locked, so the runtime ends the thread) and so never
// runs other code in the wrong namespace.
func (n netNS) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // deliberately never unlocked, see above
		f, err := os.Open("/run/netns/" + n.name)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// network is the two namespaces of one run.
type network struct {
	node, client netNS
	created      []netNS
}

// newNetwork creates the namespaces, the veth, the addresses and the
// routes for the clients numbered in clients. On error what was created is
// removed again.
func newNetwork(clients []client) (_ *network, err error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	suffix := hex.EncodeToString(b)
	nw := &network{node: netNS{"kup-demo-node-" + suffix}, client: netNS{"kup-demo-client-" + suffix}}
	defer func() {
		if err != nil {
			err = errors.Join(err, nw.remove())
		}
	}()
	for _, ns := range []netNS{nw.node, nw.client} {
		if err := run("ip", "netns", "add", ns.name); err != nil {
			return nil, err
		}
		nw.created = append(nw.created, ns)
		if err := ns.ip("link", "set", "lo", "up"); err != nil {
			return nil, err
		}
	}
	node, cl := nw.node, nw.client
	steps := [][]string{
		{"link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns", cl.name},
		{"addr", "add", nodeIP().String() + "/24", "dev", "vc0"},
		{"link", "set", "vc0", "up"},
	}
	// The pods' addresses on the node's loopback: local, like pods on a
	// node, without a third namespace (or the dummy module) for them.
	for _, p := range demoPodIPs {
		steps = append(steps, []string{"addr", "add", p + "/32", "dev", "lo"})
	}
	for _, s := range steps {
		if err := node.ip(s...); err != nil {
			return nil, err
		}
	}
	// One batch for the client addresses: there are 40 of them.
	var batch strings.Builder
	for _, c := range clients {
		fmt.Fprintf(&batch, "addr add %s/24 dev eth0\n", nsClients{}.addr(c))
	}
	fmt.Fprintf(&batch, "link set eth0 up\nroute add default via %s\n", nodeIP())
	cmd := exec.Command("ip", "-n", cl.name, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip -n %s -batch: %w: %s", cl.name, err, out)
	}
	return nw, nil
}

// remove deletes the namespaces, and with them everything in them.
func (nw *network) remove() error {
	var errs []error
	for _, ns := range nw.created {
		errs = append(errs, run("ip", "netns", "del", ns.name))
	}
	nw.created = nil
	return errors.Join(errs...)
}
