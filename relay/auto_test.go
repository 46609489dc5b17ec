package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"
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
