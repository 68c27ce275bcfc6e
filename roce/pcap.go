package roce

import (
	"bufio"
	"encoding/binary"
	"io"
	"sync"
	"time"
)

// pcapTap writes every frame the device sends or receives as a classic
// libpcap record (microsecond timestamps, LINKTYPE_ETHERNET), readable by
// tcpdump, tshark and gopacket's pcapgo.
type pcapTap struct {
	mu  sync.Mutex
	w   *bufio.Writer
	hdr [16]byte
	err error
}

const (
	pcapMagic       = 0xa1b2c3d4
	pcapSnapLen     = 65535
	pcapLinkTypeEth = 1
)

func newPcapTap(w io.Writer) (*pcapTap, error) {
	t := &pcapTap{w: bufio.NewWriterSize(w, 64<<10)}
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], pcapMagic)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], pcapSnapLen)
	binary.LittleEndian.PutUint32(h[20:], pcapLinkTypeEth)
	if _, err := t.w.Write(h[:]); err != nil {
		return nil, err
	}
	return t, t.w.Flush()
}

// write appends one record. After a write error the tap goes quiet rather
// than slowing the data path with repeated failures.
func (t *pcapTap) write(frame []byte) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return
	}
	n := len(frame)
	if n > pcapSnapLen {
		n = pcapSnapLen
	}
	binary.LittleEndian.PutUint32(t.hdr[0:], uint32(now.Unix()))
	binary.LittleEndian.PutUint32(t.hdr[4:], uint32(now.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(t.hdr[8:], uint32(n))
	binary.LittleEndian.PutUint32(t.hdr[12:], uint32(len(frame)))
	if _, err := t.w.Write(t.hdr[:]); err != nil {
		t.err = err
		return
	}
	if _, err := t.w.Write(frame[:n]); err != nil {
		t.err = err
	}
}

func (t *pcapTap) flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return t.err
	}
	t.err = t.w.Flush()
	return t.err
}

// FlushCapture writes out frames the capture tap still buffers. Close
// flushes too.
func (d *Device) FlushCapture() error {
	if tap := d.tap.Load(); tap != nil {
		return tap.flush()
	}
	return nil
}

// SetCapture starts writing a new pcap stream (header first) of every frame
// to w, replacing any capture in progress (which is flushed); nil stops
// capturing.
func (d *Device) SetCapture(w io.Writer) error {
	var tap *pcapTap
	if w != nil {
		var err error
		if tap, err = newPcapTap(w); err != nil {
			return err
		}
	}
	if old := d.tap.Swap(tap); old != nil {
		return old.flush()
	}
	return nil
}
