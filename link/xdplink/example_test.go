package xdplink_test

import (
	"context"
	"log"

	"github.com/goroce/goroce/link/xdplink"
)

// Open a link on queue 0 of eth0 for 4096-MTU RoCE frames, then echo every
// frame back.
func Example() {
	l, err := xdplink.Open("eth0", xdplink.Options{Queue: 0, FrameSize: 4096, Multibuffer: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for {
		_, err := l.ReadBatch(ctx, func(frames [][]byte) {
			// The frames are views into the UMEM: copy what must outlive
			// this call. WriteBatch copies, so echoing them is fine.
			l.WriteBatch(frames)
		})
		if err != nil {
			return
		}
	}
}
