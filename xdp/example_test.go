package xdp_test

import (
	"log"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/xdp"
)

// A receive loop: take a batch of descriptors, read the frames in place,
// give the chunks back. An XDP program must redirect the queue's traffic to
// the socket (see package bpf).
func Example() {
	s, err := xdp.Open("eth0", 0, xdp.Config{
		UMEMConfig:  xdp.UMEMConfig{FrameSize: 4096},
		Multibuffer: true, // frames larger than a chunk
	})
	if err != nil {
		log.Fatal(err) // errors.Is(err, xdp.ErrNotSupported) names the missing kernel feature
	}
	defer s.Close()

	descs := make([]xdp.Desc, 64)
	buf := make([]byte, 9216)
	for {
		n := s.Receive(descs)
		if n == 0 {
			s.Poll(unix.POLLIN, -1)
			continue
		}
		for i := 0; i < n; {
			if !descs[i].More() {
				process(s.Frame(descs[i]))
				i++
				continue
			}
			l, used, err := s.CopyFrame(buf, descs[i:n])
			if err == nil {
				process(buf[:l])
			}
			i += used
		}
		s.Release(descs[:n])
	}
}

func process([]byte) {}
