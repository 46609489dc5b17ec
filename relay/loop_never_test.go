package relay

import (
	"bytes"
	"io"
	"math"
	"testing"
	"time"
)

// never is the largest duration a flag takes (2562047h47m16.854775807s),
// a natural way to say "no bound in practice". The loop's due times are
// its clock plus a duration: a plain sum wrapped into the past, so each
// bound below ran out at once instead of never (mono.Add saturates).
const never = time.Duration(math.MaxInt64)

// --tcp-half-close-timeout: every half-closed connection was reset as
// soon as its first direction ended; here the backend answers 100 ms
// after the client's FIN.
func TestLoopHugeHalfCloseTimeoutIsNoBound(t *testing.T) {
	b := newLoopBed(t, LoopOptions{HalfCloseTimeout: never})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	time.Sleep(10 * time.Millisecond) // the loop's clock has moved past 0
	pass(t, client, backend, "request\n")
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := backend.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("backend read %d bytes, %v; want the client's FIN", n, err)
	}
	time.Sleep(100 * time.Millisecond)
	_, _ = backend.Write([]byte("answer\n"))
	_ = backend.CloseWrite()
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "answer\n" {
		t.Fatalf("client got %q, %v; want the answer then EOF", got, err)
	}
	h.wait(t)
}

// --tcp-write-timeout: a direction was reset the first time its
// destination was full; here the client reads a 4 MiB answer only after
// a 200 ms pause.
func TestLoopHugeWriteTimeoutIsNoBound(t *testing.T) {
	b := newLoopBed(t, LoopOptions{WriteTimeout: never})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	_ = client.SetReadBuffer(32 << 10)
	time.Sleep(10 * time.Millisecond)
	data := bytes.Repeat([]byte("0123456789abcdef"), (4<<20)/16)
	go func() {
		_, _ = backend.Write(data)
		_ = backend.CloseWrite()
	}()
	time.Sleep(200 * time.Millisecond) // every buffer on the way fills
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("client got %d bytes, %v; want the %d sent, then EOF", len(got), err, len(data))
	}
}

// A dial timeout (--tcp-dial-timeout): every dial failed with
// ErrDialTimeout before its connect could complete.
func TestLoopHugeDialTimeoutIsNoBound(t *testing.T) {
	b := newLoopBed(t, LoopOptions{DialTimeouts: []time.Duration{never}})
	h := newLoopHandler(b.ep)
	time.Sleep(10 * time.Millisecond)
	client, backend := b.connect(t, h, true)
	h.connected(t)
	pass(t, client, backend, "ping")
	pass(t, backend, client, "pong")
}

// CloseWhenQuiet (--max-connection-age, a Service's annotation): a huge
// age closed the connection at its first quiet moment, at once.
func TestLoopHugeCloseWhenQuietDelayIsNoRequest(t *testing.T) {
	b := newLoopBed(t, LoopOptions{Quiet: 50 * time.Millisecond})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	c := h.loopConn(t)
	time.Sleep(10 * time.Millisecond)
	c.CloseWhenQuiet(never)
	time.Sleep(300 * time.Millisecond) // six quiet periods
	pass(t, client, backend, "ping")
	pass(t, backend, client, "pong")
}

// --connection-close-quiet: the wait until the connection could be quiet
// (the quiet period less the time since its last byte) wrapped into the
// past, and the loop re-ran that timer, serving nothing else, until the
// time since the last byte outgrew the loop's age (its clock stands still
// while it runs timers): a loop up for a day stalled its connections for
// a day. Here the loop is 1 s old; the next round trip took 1 s.
func TestLoopHugeQuietKeepsLoopServing(t *testing.T) {
	b := newLoopBed(t, LoopOptions{Quiet: never})
	h := newLoopHandler(b.ep)
	client, backend := b.connect(t, h, true)
	c := h.loopConn(t)
	time.Sleep(time.Second)
	pass(t, client, backend, "ping")
	pass(t, backend, client, "pong")
	c.CloseWhenQuiet(0)
	time.Sleep(20 * time.Millisecond) // the request reaches the loop
	start := time.Now()
	pass(t, client, backend, "ping")
	pass(t, backend, client, "pong")
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("a round trip took %v after CloseWhenQuiet: the loop served nothing meanwhile", took.Round(time.Millisecond))
	}
}
