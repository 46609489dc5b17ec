package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// autoDirection runs Auto from a fresh pair's far end to another's, and
// returns the writer's end, the reader's end and the result.
func autoDirection(t *testing.T) (w, r *net.TCPConn, observed *atomic.Uint32, res chan error) {
	observed = new(atomic.Uint32)
	t.Helper()
	w, src := pair(t)
	dst, r := pair(t)
	a, err := newAutoCopier(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	a.observe = func(splicing, holding bool) {
		var v uint32
		if splicing {
			v |= observedSplicing
		}
		if holding {
			v |= observedBuffer
		}
		observed.Store(v)
	}
	res = make(chan error, 1)
	go func() {
		_, err := a.run()
		dst.CloseWrite()
		res <- err
	}()
	return w, r, observed, res
}

// What autoDirection's observed holds.
const (
	observedSplicing = 1 << iota
	observedBuffer
)

// Messages of every size, small and bulk mixed, arrive intact and in
// order while the direction switches between buffered and splice.
func TestAutoMixedSizesArriveIntact(t *testing.T) {
	w, r, _, res := autoDirection(t)
	rng := rand.New(rand.NewPCG(1, 2))
	sum := sha256.New()
	go func() {
		for i := range 400 {
			size := 1 + rng.IntN(100)
			if i%10 == 0 {
				size = autoBufSize + rng.IntN(4<<20)
			}
			msg := make([]byte, size)
			for j := range msg {
				msg[j] = byte(rng.Uint32())
			}
			sum.Write(msg)
			if _, err := w.Write(msg); err != nil {
				return
			}
		}
		w.CloseWrite()
	}()
	got := sha256.New()
	if _, err := io.Copy(got, r); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("Auto: %v", err)
	}
	if !bytes.Equal(got.Sum(nil), sum.Sum(nil)) {
		t.Fatal("bytes differ")
	}
}

// A small message is read through the buffer, a burst that fills it goes
// to splice, and the next small one comes back to the buffer; an idle
// direction holds no buffer.
func TestAutoSwitchesModes(t *testing.T) {
	w, r, observed, res := autoDirection(t)
	defer func() { w.Close(); <-res }()
	roundTrip := func(n int) {
		t.Helper()
		msg := bytes.Repeat([]byte{'x'}, n)
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = r.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(r, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	// settled waits until the copier is parked in the poller again.
	settled := func() { time.Sleep(50 * time.Millisecond) }
	state := func() (splicing, holding bool) {
		v := observed.Load()
		return v&observedSplicing != 0, v&observedBuffer != 0
	}

	roundTrip(64)
	settled()
	if splicing, holding := state(); splicing || holding {
		t.Fatalf("after 64 bytes: splicing %v, buffer held %v; want buffered and idle without a buffer", splicing, holding)
	}
	// A burst the reader drains slowly keeps the socket full: reads fill
	// the buffer and the direction must go to splice.
	go func() { _, _ = w.Write(bytes.Repeat([]byte{'y'}, 8<<20)) }()
	time.Sleep(100 * time.Millisecond)
	sawSplice := false
	_ = r.SetReadDeadline(time.Now().Add(5 * time.Second))
	chunk := make([]byte, 64<<10)
	for got := 0; got < 8<<20; {
		if splicing, _ := state(); splicing {
			sawSplice = true
		}
		n, err := r.Read(chunk)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if !sawSplice {
		t.Error("an 8 MiB burst never switched the direction to splice")
	}
	roundTrip(64)
	settled()
	if splicing, holding := state(); splicing || holding {
		t.Fatalf("after a small message following a burst: splicing %v, buffer held %v; want buffered without a buffer", splicing, holding)
	}
}

// A failure writing to dst is a *WriteError, so TCP resets the right peer.
func TestAutoWriteFailureIsWriteError(t *testing.T) {
	w, r, _, res := autoDirection(t)
	_ = r.SetLinger(0)
	r.Close()
	var err error
	for range 100 {
		if _, werr := w.Write(make([]byte, 64<<10)); werr != nil {
			break
		}
		select {
		case err = <-res:
		case <-time.After(20 * time.Millisecond):
			continue
		}
		break
	}
	if err == nil {
		select {
		case err = <-res:
		case <-time.After(5 * time.Second):
			t.Fatal("Auto did not end after dst was reset")
		}
	}
	var we *WriteError
	if !errors.As(err, &we) {
		t.Fatalf("Auto returned %v, want a *WriteError", err)
	}
}

// With the TCP_INQ hint a direction writes a message that emptied its
// source inside the raw read, without going back to run; without it
// (plain sockets) run writes it. Both must relay the same.
var inqPairs = map[string]func(*testing.T) (a, b *net.TCPConn){"inq": pair, "no-hint": plainPair}

func TestAutoSmallMessagesBothWays(t *testing.T) {
	for name, newPair := range inqPairs {
		t.Run(name, func(t *testing.T) {
			in, out := &count{}, &count{}
			client, backend, done := relayedOver(t, newPair, Options{In: in, Out: out})
			const rounds = 500
			go func() {
				buf := make([]byte, 64)
				for {
					n, err := backend.Read(buf)
					if err != nil {
						backend.Close()
						return
					}
					if _, err := backend.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			msg, got := []byte("0123456789abcdef"), make([]byte, 16)
			_ = client.SetDeadline(time.Now().Add(10 * time.Second))
			for i := range rounds {
				msg[0] = byte(i)
				if _, err := client.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(client, got); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("round %d: got %q, want %q", i, got, msg)
				}
			}
			client.CloseWrite()
			if _, err := client.Read(got); err != io.EOF {
				t.Fatalf("after the client's FIN: %v, want the backend's FIN passed on (EOF)", err)
			}
			<-done
			if in.n != rounds*16 || out.n != rounds*16 {
				t.Fatalf("counted %v in, %v out; want %d each (bytes relayed inside the read counted too)", in.n, out.n, rounds*16)
			}
		})
	}
}

// A message and the FIN after it can arrive together; the read that takes
// the message then leaves the EOF queued with no new wake-up to come. The
// hint says so (1, not 0), and the FIN is passed on at once.
func TestAutoMessageWithFIN(t *testing.T) {
	for name, newPair := range inqPairs {
		t.Run(name, func(t *testing.T) {
			client, backend, done := relayedOver(t, newPair, Options{})
			// The proxy waits in a read on the client; both arrive while
			// it sleeps, so one wake-up finds message and FIN queued.
			if _, err := client.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			client.CloseWrite()
			_ = backend.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(backend)
			if err != nil || string(got) != "last words" {
				t.Fatalf("backend read %q, %v; want the message, then EOF", got, err)
			}
			backend.Close()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("relay did not end after both FINs")
			}
		})
	}
}

// A message that empties src, written inside the read to a dst whose peer
// reset the connection, comes back from readOnce as a *WriteError (so TCP
// resets the client, the side that did not fail), with nothing counted.
func TestAutoInlineWriteFailureIsWriteError(t *testing.T) {
	srcPeer, src := pair(t)
	dst, dstPeer := pair(t)
	_ = dstPeer.SetLinger(0)
	dstPeer.Close() // RST to dst
	time.Sleep(20 * time.Millisecond)
	a, err := newAutoCopier(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	defer a.release()
	if _, err := srcPeer.Write([]byte("anyone?")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // queued on src
	n, err := a.readOnce()
	var we *WriteError
	if n != 0 || a.relayed != 0 || !errors.As(err, &we) {
		t.Fatalf("readOnce: %d, relayed %d, %v; want 0, 0 and a *WriteError", n, a.relayed, err)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("readOnce: %v, want the reset from dst", err)
	}
}

// A message that empties src meets a dst already full: the write inside
// the read takes nothing, the message is left in the buffer for run's
// writeAll (which waits for room), and it arrives after what was queued.
func TestAutoInlineWriteLeavesAFullDestinationToRun(t *testing.T) {
	srcPeer, src := pair(t)
	dst, dstPeer := pair(t)
	_ = dst.SetWriteBuffer(4 << 10)
	raw, err := dst.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	filler, queued := bytes.Repeat([]byte{'.'}, 64<<10), 0
	fill := func() {
		_ = raw.Control(func(fd uintptr) {
			for {
				n, err := unix.Write(int(fd), filler)
				if err != nil {
					return // EAGAIN: dst is full
				}
				queued += n
			}
		})
	}
	fill()
	a, err := newAutoCopier(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	defer a.release()
	if _, err := srcPeer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // queued on src
	// Full again: a loaded machine's late ACKs may have freed room in
	// dst meanwhile, and then the inline write takes the 5 bytes and
	// readOnce waits on src for more, which never come (it hung the
	// package until its timeout once): src's deadline ends such a wait.
	fill()
	_ = src.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := a.readOnce()
	if errors.Is(err, os.ErrDeadlineExceeded) && a.relayed == 5 {
		t.Skip("no verdict: dst took the 5 bytes inline; room opened in it between its fill and the write")
	}
	_ = src.SetReadDeadline(time.Time{})
	if err != nil || n != 5 || a.relayed != 0 || string((*a.buf)[:n]) != "hello" {
		t.Fatalf("readOnce: %d %q, relayed %d, %v; want the 5 bytes left to run", n, (*a.buf)[:max(n, 0)], a.relayed, err)
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, queued+5)
		_ = dstPeer.SetReadDeadline(time.Now().Add(5 * time.Second))
		m, _ := io.ReadFull(dstPeer, b)
		got <- b[:m]
	}()
	if w, err := a.writeAll(); w != 5 || err != nil {
		t.Fatalf("writeAll: %d, %v; want 5", w, err)
	}
	b := <-got
	if len(b) != queued+5 || string(b[queued:]) != "hello" {
		t.Fatalf("dst's peer read %d bytes ending %q; want %d ending \"hello\"", len(b), b[max(len(b)-5, 0):], queued+5)
	}
}
