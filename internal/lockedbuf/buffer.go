// Package lockedbuf owns Buffer, a byte buffer that goroutines may write
// while another reads it: the log sink of a process or of klog that a test,
// or the demo, reads as it goes.
package lockedbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer behind a mutex. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
