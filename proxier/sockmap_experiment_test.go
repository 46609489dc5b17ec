//go:build sockmap

package proxier_test

// The sockmap experiment (issue 11, item 6): is a kernel-assisted relay —
// both sockets of a proxied connection in a BPF sockhash, an sk_skb verdict
// program redirecting each socket's bytes to its peer's transmit side —
// worth a data path? It runs beside the event loop on the small-request
// load where it should shine (64 kept-alive connections, 64-byte request
// and echo) and reports the CPU of the whole machine per request, because
// the kernel does the redirected sends in kworker threads that no process is
// charged for: proc-ns/op alone would flatter it.
//
//	go test -tags sockmap -run '^$' -bench SockmapExperiment -benchtime 100000x -count 6 ./proxier
//
// Root only (BPF maps and programs). The sockmap proxy here is the least a
// data path would do (no FIN, no reset, no byte cap, sockets inserted
// before the first byte) and still did not beat the event loop; see
// test/bench/README.md, "A kernel-assisted relay (sockmap): measured, left
// out".

import (
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxier"
)

// machineCPU is the busy time of every CPU so far (user, nice, system,
// irq, softirq), from /proc/stat.
func machineCPU(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq ...
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		ticks += v
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// sockmapVerdict redirects every non-empty skb of a paired socket to its
// peer's transmit side and counts the bytes in the pair's entry. The pairs
// map is socket cookie → {bytes redirected, peer's cookie}; the sockhash is
// keyed by cookie. An empty skb is a bare FIN: redirecting it would stop
// the peer's transmit, so it is dropped (the FIN itself still reaches the
// socket's state, where a proxy would see it). Unpaired sockets pass.
func sockmapVerdict(pairs, sockets *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),                  // r6 = skb
		asm.LoadMem(asm.R7, asm.R6, 0, asm.Word),     // r7 = skb->len
		asm.JEq.Imm(asm.R7, 0, "drop"),               // a bare FIN
		asm.FnGetSocketCookie.Call(),                 // r0 = this socket's cookie
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord), // key on the stack
		asm.LoadMapPtr(asm.R1, pairs.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.StoreXAdd(asm.R8, asm.R7, asm.DWord), // bytes redirected += len
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, sockets.FD()),
		asm.Mov.Reg(asm.R3, asm.R8),
		asm.Add.Imm(asm.R3, 8), // the peer's cookie is the key
		asm.Mov.Imm(asm.R4, 0), // its transmit side, not its receive side
		asm.FnSkRedirectHash.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("drop"), // SK_DROP
		asm.Return(),
	}
}

func rawFd(b *testing.B, c net.Conn) int {
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// sockmapProxy accepts on loopback, dials backend and hands both sockets
// to the kernel. Clients must not send before the pair is in the map: a
// byte queued before the insert is never redirected and never read (one
// more thing a real data path would have to handle).
func sockmapProxy(b *testing.B, backend netip.AddrPort) netip.AddrPort {
	b.Helper()
	pairs, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 16, MaxEntries: 4096})
	if err != nil {
		b.Fatal(err)
	}
	sockets, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 8, ValueSize: 8, MaxEntries: 4096})
	if err != nil {
		pairs.Close()
		b.Fatal(err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkSKB, AttachType: ebpf.AttachSkSKBVerdict,
		Instructions: sockmapVerdict(pairs, sockets), License: "Dual MIT/GPL"})
	if err == nil {
		err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: sockets.FD(), Program: prog, Attach: ebpf.AttachSkSKBVerdict})
	}
	ln, lerr := net.Listen("tcp4", "127.0.0.1:0")
	var mu sync.Mutex
	var held []net.Conn
	b.Cleanup(func() {
		if ln != nil {
			ln.Close()
		}
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		if prog != nil {
			prog.Close()
		}
		sockets.Close()
		pairs.Close()
	})
	if err != nil || lerr != nil {
		b.Fatal(err, lerr)
	}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp4", backend.String())
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			held = append(held, client, server)
			mu.Unlock()
			cfd, sfd := rawFd(b, client), rawFd(b, server)
			cc, err1 := unix.GetsockoptUint64(cfd, unix.SOL_SOCKET, unix.SO_COOKIE)
			sc, err2 := unix.GetsockoptUint64(sfd, unix.SOL_SOCKET, unix.SO_COOKIE)
			for _, err := range []error{err1, err2,
				pairs.Put(cc, [2]uint64{0, sc}), pairs.Put(sc, [2]uint64{0, cc}),
				sockets.Put(cc, uint64(cfd)), sockets.Put(sc, uint64(sfd))} {
				if err != nil {
					panic("sockmap experiment: " + err.Error())
				}
			}
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// BenchmarkSockmapExperiment: 64 kept-alive connections, each sending a
// 64-byte request and waiting for its echo; ns/op is per request across all.
func BenchmarkSockmapExperiment(b *testing.B) {
	echo := startTCPEcho(b)
	loop := proxiedPortWith(b, v1.ProtocolTCP, echo, proxier.Options{DataPath: proxier.DataPathEventLoop})
	sockmap := sockmapProxy(b, echo)
	for _, c := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", echo}, {"eventloop", loop}, {"sockmap", sockmap}} {
		b.Run(c.name, func(b *testing.B) { benchKeepAliveConns(b, c.addr, 64) })
	}
}

func benchKeepAliveConns(b *testing.B, addr netip.AddrPort, n int) {
	conns := make([]*net.TCPConn, n)
	for i := range conns {
		c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(addr))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	time.Sleep(100 * time.Millisecond) // the sockmap proxy's inserts
	per := max(b.N/n, 1)
	machine, proc := machineCPU(b), processCPU()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, 64)
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			for range per {
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				if _, err := io.ReadFull(c, msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	requests := float64(per * n)
	b.ReportMetric(float64(machineCPU(b)-machine)/requests, "machine-cpu-ns/op")
	b.ReportMetric(float64(processCPU()-proc)/requests, "process-cpu-ns/op")
}
