package proxier

import (
	"context"
	"time"
)

// dialDeadline is the context of one dial attempt: it carries the
// attempt's deadline and nothing else. net's connect waits for the socket
// to become writable with the poller's own deadline, which it sets from
// Deadline, so a dial that times out still ends at the deadline with "i/o
// timeout"; what the attempt no longer costs is context.WithTimeout's
// timer, its cancel registration and its garbage (Done never closes, and
// AfterFunc registers nothing, so net starts no goroutine to watch it).
type dialDeadline time.Time

var _ context.Context = dialDeadline{}

// neverDone is the Done channel of every dialDeadline.
var neverDone = make(chan struct{})

func (d dialDeadline) Deadline() (time.Time, bool) { return time.Time(d), true }
func (dialDeadline) Done() <-chan struct{}         { return neverDone }
func (dialDeadline) Err() error                    { return nil }
func (dialDeadline) Value(any) any                 { return nil }

// AfterFunc lets context.AfterFunc (net's connect uses it to wake the
// poller when the context ends) register nothing: this context never ends
// by itself, the poller's deadline does.
func (dialDeadline) AfterFunc(func()) func() bool { return stopNothing }

func stopNothing() bool { return true }
