package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// pattern is the byte stream of one connection: ChaCha8 from its seed, so the
// reader regenerates what the writer sent and compares every byte without
// keeping a copy.
func pattern(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	binary.LittleEndian.PutUint64(s[8:], 0x736f616b) // "soak"
	return rand.NewChaCha8(s)
}

// conn is one proxied TCP connection after the backend's greeting: which
// Service it went to and which backend answered (-1 when unknown yet).
type conn struct {
	c        *net.TCPConn
	r        *bufio.Reader
	svc      int
	backend  int
	removals int64 // the backend's removal count from svc when it answered
}

// dialEcho connects from ns (source src) to Service svc's ClusterIP, asks for
// an ECHO stream and reads the greeting "bN REMOTE".
func dialEcho(ns *netns.NS, src netip.Addr, svcs *services, svc int, deadline time.Time) (*conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.DialTCP(ctx, src, netip.AddrPortFrom(clusterIP(svc), tcpPort))
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	cn := &conn{c: c, r: bufio.NewReaderSize(c, 32<<10), svc: svc, backend: -1}
	_ = c.SetDeadline(deadline)
	if _, err := c.Write([]byte("ECHO\n")); err != nil {
		c.Close()
		return nil, fmt.Errorf("request: %w", err)
	}
	line, err := cn.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	n, err := strconv.Atoi(strings.TrimPrefix(name, "b"))
	if err != nil || !strings.HasPrefix(name, "b") {
		c.Close()
		return nil, fmt.Errorf("greeting %q: %w", line, errCorrupt)
	}
	cn.backend = n - 1
	cn.removals = svcs.removed(svc, cn.backend)
	return cn, nil
}

// removedMeanwhile says whether the connection's backend left its Service
// since it answered.
func (cn *conn) removedMeanwhile(svcs *services) bool {
	return cn.backend >= 0 && svcs.removed(cn.svc, cn.backend) != cn.removals
}

func (cn *conn) String() string {
	return fmt.Sprintf("%s -> %s (s%02d, b%d)", cn.c.LocalAddr(), cn.c.RemoteAddr(), cn.svc, cn.backend+1)
}

// streamEcho sends n bytes of seed's pattern in chunks of chunk bytes, one
// chunk per gap (0: as fast as possible), half-closes, and meanwhile reads
// the echo in reads of at most readSize bytes with readGap between them,
// comparing each byte; it wants exactly n bytes and then EOF. It returns the
// bytes that came back intact.
func (cn *conn) streamEcho(seed uint64, n int64, chunk int, gap time.Duration, readSize int, readGap time.Duration) (int64, error) {
	werr := make(chan error, 1)
	go func() {
		gen := pattern(seed)
		buf := make([]byte, chunk)
		next := time.Now()
		for left := n; left > 0; {
			k := int(min(int64(chunk), left))
			_, _ = gen.Read(buf[:k])
			if _, err := cn.c.Write(buf[:k]); err != nil {
				werr <- fmt.Errorf("write after %d bytes: %w", n-left, err)
				return
			}
			left -= int64(k)
			if gap > 0 {
				next = next.Add(gap)
				time.Sleep(time.Until(next))
			}
		}
		if err := cn.c.CloseWrite(); err != nil {
			werr <- fmt.Errorf("half-close: %w", err)
			return
		}
		werr <- nil
	}()
	got, rerr := readPattern(cn.r, seed, n, readSize, readGap)
	if rerr != nil {
		_ = cn.c.SetLinger(0) // unblock the writer at once
		cn.c.Close()
		<-werr
		return got, rerr
	}
	return got, <-werr
}

// readPattern reads seed's pattern from r until EOF and wants exactly n bytes.
func readPattern(r io.Reader, seed uint64, n int64, readSize int, readGap time.Duration) (int64, error) {
	gen := pattern(seed)
	buf := make([]byte, readSize)
	want := make([]byte, readSize)
	var got int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if got+int64(k) > n {
				return got, fmt.Errorf("%d bytes past the %d sent: %w", got+int64(k)-n, n, errCorrupt)
			}
			_, _ = gen.Read(want[:k])
			if !bytes.Equal(buf[:k], want[:k]) {
				return got, fmt.Errorf("at byte %d: %w", got, errCorrupt)
			}
			got += int64(k)
		}
		if errors.Is(err, io.EOF) {
			if got != n {
				return got, fmt.Errorf("EOF after %d of %d bytes: %w", got, n, errShort)
			}
			return got, nil
		}
		if err != nil {
			return got, fmt.Errorf("read after %d of %d bytes: %w", got, n, err)
		}
		if readGap > 0 {
			time.Sleep(readGap)
		}
	}
}

// exchange sends one message of seed's pattern and reads its echo back.
func (cn *conn) exchange(gen *rand.ChaCha8, msg, want []byte) error {
	_, _ = gen.Read(msg)
	copy(want, msg)
	if _, err := cn.c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(cn.r, got); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("message echo: %v: %w", err, errShort)
		}
		return fmt.Errorf("message echo: %w", err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("message echo: %w", errCorrupt)
	}
	return nil
}

// closeClean half-closes and wants EOF with nothing more.
func (cn *conn) closeClean() error {
	defer cn.c.Close()
	if err := cn.c.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	var one [1]byte
	k, err := cn.r.Read(one[:])
	if k > 0 {
		return fmt.Errorf("byte after the last echo: %w", errCorrupt)
	}
	if !errors.Is(err, io.EOF) {
		return fmt.Errorf("closing: %w", err)
	}
	return nil
}
