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
	buf := *bp
	var total int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, &WriteError{werr}
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
