package relay

import (
	"io"
	"net"
	"sync"
)

// CopyBufSize, the length of a GetBuffer buffer, matches the socket reads
// a busy connection sees; the buffer is pooled, so a copy allocates
// nothing per byte or per call.
const CopyBufSize = 32 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, CopyBufSize); return &b }}

// GetBuffer lends a copy buffer (CopyBufSize long); PutBuffer returns it.
func GetBuffer() *[]byte  { return copyBufs.Get().(*[]byte) }
func PutBuffer(b *[]byte) { copyBufs.Put(b) }

// Copy moves src to dst through a pooled buffer until src ends: the path
// for a direction that cannot splice. A failure on dst is a *WriteError.
func Copy(dst, src *net.TCPConn) (int64, error) {
	bp := GetBuffer()
	defer PutBuffer(bp)
	var total int64
	for {
		n, err := copyOnce(dst, src, *bp)
		total += n
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// copyOnce reads src once into buf and writes what came to dst; io.EOF
// once src ended. A failure on dst is a *WriteError.
func copyOnce(dst, src *net.TCPConn, buf []byte) (int64, error) {
	n, err := src.Read(buf)
	if n > 0 {
		w, werr := dst.Write(buf[:n])
		if werr != nil {
			return int64(w), &WriteError{werr}
		}
	}
	return int64(n), err
}
