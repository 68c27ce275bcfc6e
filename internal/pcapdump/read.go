package pcapdump

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// ErrUnknownFormat is returned for input that is neither pcap nor pcapng.
var ErrUnknownFormat = errors.New("pcapdump: not a pcap or pcapng file")

// File magics, as the first four bytes read big-endian.
const (
	magicPcapMicro        = 0xa1b2c3d4
	magicPcapMicroSwapped = 0xd4c3b2a1
	magicPcapNano         = 0xa1b23c4d
	magicPcapNanoSwapped  = 0x4d3cb2a1
	magicPcapNG           = 0x0a0d0d0a // section header block type, same in either byte order
)

// Frame is one captured frame.
type Frame struct {
	Number   int // 1-based, as tshark's frame.number
	LinkType layers.LinkType
	Data     []byte
	OrigLen  int // length on the wire; more than len(Data) if the capture cut the frame
}

// ReadFrames reads a pcap or pcapng stream (detected by its magic) and calls
// fn for every frame in order. Data is only valid during the call. It stops at
// the first error from fn or from the file.
func ReadFrames(r io.Reader, fn func(Frame) error) error {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnknownFormat, err)
	}
	switch binary.BigEndian.Uint32(magic) {
	case magicPcapMicro, magicPcapMicroSwapped, magicPcapNano, magicPcapNanoSwapped:
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return err
		}
		lt := pr.LinkType()
		for n := 1; ; n++ {
			data, ci, err := pr.ZeroCopyReadPacketData()
			if err == io.EOF && ci.CaptureLength > 0 {
				// A record header with no data after it: a cut-off file.
				err = io.ErrUnexpectedEOF
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("frame %d: %w", n, err)
			}
			if err := fn(Frame{Number: n, LinkType: lt, Data: data, OrigLen: ci.Length}); err != nil {
				return err
			}
		}
	case magicPcapNG:
		// Mixed link types are allowed so that each frame reports its own.
		ng, err := pcapgo.NewNgReader(br, pcapgo.NgReaderOptions{WantMixedLinkType: true})
		if err != nil {
			return err
		}
		for n := 1; ; n++ {
			data, ci, err := ng.ZeroCopyReadPacketData()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("frame %d: %w", n, err)
			}
			lt := ng.LinkType()
			if iface, err := ng.Interface(ci.InterfaceIndex); err == nil {
				lt = iface.LinkType
			}
			if err := fn(Frame{Number: n, LinkType: lt, Data: data, OrigLen: ci.Length}); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w (magic %x)", ErrUnknownFormat, magic)
	}
}
