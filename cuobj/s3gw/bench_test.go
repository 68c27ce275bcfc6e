package s3gw

import (
	"context"
	"testing"
)

// BenchmarkS3RDMAGet4KiB is one GET of a 4 KiB object through the whole
// control path (HTTP on loopback, the server's file read, buffer
// registration, RDMA WRITE): its time per object, against the bare
// cuobj.BenchmarkGet4KiB, is what the control path adds.
func BenchmarkS3RDMAGet4KiB(b *testing.B) { benchGet(b, 4096) }

// BenchmarkS3RDMAGet1MiB is the same for 1 MiB objects.
func BenchmarkS3RDMAGet1MiB(b *testing.B) { benchGet(b, 1<<20) }

func benchGet(b *testing.B, size int) {
	e := setupB(b)
	e.s.mustOK(b, "PUT", "/bucket/o", data(size))
	buf := make([]byte, size)
	if err := e.cli.RDMA().Register(buf); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if n, byRDMA, err := e.cli.Get(ctx, "bucket", "o", buf); err != nil || !byRDMA || n != int64(size) {
			b.Fatal(n, byRDMA, err)
		}
	}
}
