package soak

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Traffic kinds, in report order.
const (
	kindNew       = "tcp new (echo 1-32 KiB)"
	kindHalfClose = "tcp half-closed (512 KiB, slow reader)"
	kindKeepAlive = "tcp kept-alive (message every 0.2-1 s)"
	kindStream    = "tcp long stream (1 MiB/s)"
	kindVanish    = "tcp vanished client (no FIN)"
	kindUDP       = "udp (fresh source port per query)"
)

var kinds = []string{kindNew, kindHalfClose, kindKeepAlive, kindStream, kindVanish, kindUDP}

// errCorrupt marks bytes that came back different from what was sent (or
// more of them); errShort marks a clean end before every byte came back.
var (
	errCorrupt = errors.New("echo differs from what was sent")
	errShort   = errors.New("clean end before every byte came back")
)

// tally counts how connections (or UDP queries) of one kind ended.
type tally struct {
	ok         atomic.Int64 // every byte came back intact
	failed     atomic.Int64 // failed although its endpoint was listed all along
	cutRemoved atomic.Int64 // cut after its endpoint was removed; bytes intact
	corrupt    atomic.Int64 // bytes lost or changed (always a failure)
	bytes      atomic.Int64 // bytes echoed and verified
}

// tallies is every kind's tally plus the first failures, for the log.
type tallies struct {
	by map[string]*tally

	mu    sync.Mutex
	first []string
}

func newTallies() *tallies {
	t := &tallies{by: map[string]*tally{}}
	for _, k := range kinds {
		t.by[k] = &tally{}
	}
	return t
}

const keepFailures = 30

// end records one connection: err nil is a success; removedMeanwhile says its
// endpoint was removed from its Service while it lived.
func (t *tallies) end(kind string, verified int64, err error, removedMeanwhile bool, what string) {
	k := t.by[kind]
	k.bytes.Add(verified)
	switch {
	case err == nil:
		k.ok.Add(1)
		return
	case errors.Is(err, errCorrupt) || errors.Is(err, errShort):
		k.corrupt.Add(1)
	case removedMeanwhile:
		k.cutRemoved.Add(1)
		return
	default:
		k.failed.Add(1)
	}
	t.mu.Lock()
	if len(t.first) < keepFailures {
		t.first = append(t.first, fmt.Sprintf("%s: %s: %v", kind, what, err))
	}
	t.mu.Unlock()
}

func (t *tallies) failures() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.first...)
}
