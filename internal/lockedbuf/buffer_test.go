package lockedbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once (run with -race): every write lands whole.
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("ab\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); strings.Count(got, "ab\n") != 400 || len(got) != 1200 {
		t.Fatalf("%d bytes, %d whole writes; want 1200, 400", len(got), strings.Count(got, "ab\n"))
	}
}
