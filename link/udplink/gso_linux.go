package udplink

import (
	"net/netip"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/sys"
	"github.com/goroce/goroce/link"
)

// UDP segmentation offload (UDP_SEGMENT, Linux 4.18) on transmit and
// receive offload (UDP_GRO, Linux 5.0): a run of equal-size datagrams to
// one destination leaves in one sendmmsg entry, and the kernel hands a
// run it kept whole (loopback, veth) or coalesced back as one buffer that
// the link splits into frames again. Each datagram stays exactly as the
// transport built it: the run is the frames' payloads side by side, cut
// at the segment size, so the ICRC the transport computed still holds.
//
// A coalesced buffer is one run of payloads, but the device wants each
// datagram behind its own headers. Rather than copy every segment after
// the first behind a header, the link lays its receive buffers out for
// the segment size it sees most (spread): one iovec per segment with a
// header's room between them, so the kernel itself leaves each segment
// where its frame can be built in place. A buffer of another segment size
// still arrives whole, across the same iovecs, and its segments are
// gathered into the arena.

const (
	// gsoMaxSegments is UDP_MAX_SEGMENTS of Linux 4.18 (later kernels
	// allow more).
	gsoMaxSegments = 64
	// gsoMaxBytes is the most UDP payload one GSO send may carry: an IPv4
	// datagram's 65535 bytes less its IP and UDP headers.
	gsoMaxBytes = 65535 - link.IPv4Size - link.UDPSize
	// groBufSize is a receive buffer with GRO on: a coalesced run is at
	// most a 64 KiB IP packet.
	groBufSize = 65536
	// groArenaSegments bounds the segments of one coalesced buffer that
	// get their own synthesized header (UDP_GRO_CNT_MAX is 64; a local
	// sender's run may have up to UDP_MAX_SEGMENTS, 128 on newer kernels).
	groArenaSegments = 128
	// spreadMinSegment is the smallest segment size receive buffers are
	// laid out for: smaller ones would need more iovecs than a buffer
	// should carry, for little gain.
	spreadMinSegment = 1024
	// spreadMaxIovs is the most iovecs of a spread receive buffer.
	spreadMaxIovs = (groBufSize + spreadMinSegment - 1) / spreadMinSegment
	// spreadWindow is how many coalesced datagrams pass between decisions
	// to lay the buffers out for another segment size.
	spreadWindow = 256
)

// offload is the GSO/GRO state of a Link.
type offload struct {
	gso         atomic.Bool // UDP_SEGMENT in use; cleared when the kernel refuses it
	gro         bool        // UDP_GRO is on: receive buffers hold coalesced runs
	maxDatagram int

	arena []byte // frames gathered from coalesced buffers, with headers

	// The receive buffers' layout: 0, one iovec; else one iovec of spread
	// bytes per segment, hsize bytes apart (receive side, under readMu).
	spread     int
	hsize      int
	spreadIovs []unix.Iovec
	hits       int // coalesced datagrams of size spread since the last decision
	misses     int // those of another size at least spreadMinSegment
	missSeg    int // the size of the last of those

	gsoSends     atomic.Uint64
	gsoDatagrams atomic.Uint64
	gsoFallbacks atomic.Uint64
	groBuffers   atomic.Uint64
	groDatagrams atomic.Uint64
	groCopied    atomic.Uint64
}

// gsoRun is one send message: frames [first, first+count) of the chunk
// (one iovec each), to one destination, every one seg bytes but the last,
// which may be shorter and then ends the run.
type gsoRun struct {
	first, count int
	seg, bytes   int
	oobLen       int // control data written before the UDP_SEGMENT message
	closed       bool
	src, dst     netip.Addr
	dport        uint16
	tos          uint8
	qpn          uint32 // destination QPN of every datagram (destQPN)
}

// probeOffloads turns on what the kernel supports and opts allows. A kernel
// without UDP_SEGMENT (before 4.18) fails the getsockopt with ENOPROTOOPT;
// one without UDP_GRO (before 5.0) fails the setsockopt.
func (l *Link) probeOffloads(fd int, opts Options) {
	if !opts.DisableGSO {
		if _, err := unix.GetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT); err == nil {
			l.off.gso.Store(true)
		}
	}
	if !opts.DisableGRO {
		if unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil {
			l.off.gro = true
		}
	}
}

// recvBufSize is the size of each receive buffer after the headroom.
func (l *Link) recvBufSize(maxDatagram int) int {
	l.off.maxDatagram = maxDatagram
	if l.off.gro && maxDatagram < groBufSize {
		return groBufSize
	}
	return maxDatagram
}

// spreadSlack is what a receive buffer needs beyond recvBufSize for the
// spread layouts: the header gaps, and the last iovec's room past 64 KiB.
func (l *Link) spreadSlack() int {
	if !l.off.gro {
		return 0
	}
	return l.off.maxDatagram + spreadMaxIovs*(link.EthernetSize+link.IPv6Size+link.UDPSize)
}

// initOffload allocates the per-message state the offloads need.
func (l *Link) initOffload() {
	if l.off.gro {
		l.off.hsize = link.EthernetSize + link.IPv4Size + link.UDPSize
		if l.v6 {
			l.off.hsize = link.EthernetSize + link.IPv6Size + link.UDPSize
		}
		l.off.spreadIovs = make([]unix.Iovec, l.batch*spreadMaxIovs)
		l.off.arena = make([]byte, l.batch*(groBufSize+groArenaSegments*headroom))
		// Room for every segment of a full batch of runs, so that splitting
		// never grows the slice.
		l.frames = make([][]byte, 0, l.batch*gsoMaxSegments)
	}
}

// gsoSafe reports whether a run to dst may be cut by the kernel. IPv6 has
// no ID; an IPv4 segment gets the run's ID plus its index, which breaks
// the ICRC the transport computed with ID 0 (Info.IPIDZero) for any peer
// that checks it over the wire header. Local destinations never put the
// segments on a wire: a receiver with UDP_GRO gets the run whole, one
// without it gets segments from the kernel, not from a wire.
func (l *Link) gsoSafe(dst netip.Addr) bool {
	return dst.Is6() || dst.IsLoopback() || dst == l.addr
}

// fillChunk prepares up to l.batch frames, starting at frames[0], as send
// messages, joining runs for GSO when gso is set. Frames before index
// single each get their own message. It returns the number of frames and
// messages prepared and the error of the frame that stopped it, if any.
func (s *sender) fillChunk(frames [][]byte, single int, gso bool) (nf, nm int, bad error) {
	for nf < len(frames) && nf < s.batch {
		f, err := s.l.check(frames[nf])
		if err != nil {
			bad = err
			break
		}
		if !gso || nf < single || !s.joinRun(nm-1, nf, frames[nf], &f) {
			s.prepare(nm, nf, frames[nf], &f)
			s.runs[nm].closed = s.runs[nm].closed || nf < single
			nm++
		}
		nf++
	}
	for k := 0; k < nm; k++ {
		if r := &s.runs[k]; r.count > 1 {
			s.putSegment(k, r)
		}
	}
	return nf, nm, bad
}

// joinRun adds frame j to the run of message k when it can be cut from it
// by the kernel: same destination, TOS and source, and no longer than the
// run's segment size.
func (s *sender) joinRun(k, j int, frame []byte, f *link.Frame) bool {
	if k < 0 {
		return false
	}
	r := &s.runs[k]
	size := f.End - f.Payload
	if r.closed || size == 0 || size > r.seg || r.count >= gsoMaxSegments || r.bytes+size > gsoMaxBytes ||
		f.Dst != r.dst || f.DstPort != r.dport || f.TOS != r.tos || f.Src != r.src || destQPN(frame, f) != r.qpn || !s.l.gsoSafe(f.Dst) {
		return false
	}
	iov := &s.wiovs[j]
	iov.Base = &frame[f.Payload]
	iov.SetLen(size)
	r.count++
	r.bytes += size
	r.closed = size < r.seg
	s.wmsgs[k].Hdr.SetIovlen(r.count)
	return true
}

// startRun records message k as a run of frame j alone.
func (s *sender) startRun(k, j, oobLen int, frame []byte, f *link.Frame) {
	size := f.End - f.Payload
	s.runs[k] = gsoRun{first: j, count: 1, seg: size, bytes: size, oobLen: oobLen, closed: size == 0,
		src: f.Src, dst: f.Dst, dport: f.DstPort, tos: f.TOS, qpn: destQPN(frame, f)}
}

// destQPN returns the destination QPN of the BTH a frame carries, or
// noQPN when it is too short for one. A run carries the datagrams of one
// QP only: a receiver on the same host gets the run whole, and one of
// several receive queues (Options.Queues) takes it by the QPN of its
// first datagram.
func destQPN(frame []byte, f *link.Frame) uint32 {
	if f.End-f.Payload < 8 {
		return noQPN
	}
	b := frame[f.Payload+5 : f.Payload+8]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

// noQPN is destQPN's answer for a datagram too short to hold a BTH.
const noQPN = 1 << 24

// putSegment adds the UDP_SEGMENT control message to message k.
func (s *sender) putSegment(k int, r *gsoRun) {
	oob := s.woob[k*oobSize : (k+1)*oobSize]
	d, sp := sys.PutCmsg(oob[r.oobLen:], unix.SOL_UDP, unix.UDP_SEGMENT, 2)
	*(*uint16)(unsafe.Pointer(&d[0])) = uint16(r.seg)
	h := &s.wmsgs[k].Hdr
	h.Control = &oob[0]
	h.SetControllen(r.oobLen + sp)
}

// framesBefore returns how many frames messages [0, k) of a chunk of nm
// messages and nf frames carry.
func (s *sender) framesBefore(k, nm, nf int) int {
	if k >= nm {
		return nf
	}
	return s.runs[k].first
}

// countRuns adds the runs among the first k messages to the counters.
func (s *sender) countRuns(k int) {
	for i := 0; i < k; i++ {
		if c := s.runs[i].count; c > 1 {
			s.l.off.gsoSends.Add(1)
			s.l.off.gsoDatagrams.Add(uint64(c))
		}
	}
}

// gsoRefused reports whether a run failing with err, whose datagrams then
// went out one by one, shows that the kernel will not segment for this
// socket (UDP_NO_CHECK, IPsec on the path, an unknown cmsg): GSO is then
// turned off for good rather than failing and resending every run.
func gsoRefused(err error) bool {
	switch err {
	case unix.EINVAL, unix.EIO, unix.EOPNOTSUPP, unix.ENOPROTOOPT:
		return true
	}
	return false
}

// groSegment returns the segment size of a coalesced buffer from its
// control messages (the UDP_GRO message), or 0 when it holds one datagram.
func groSegment(oob []byte) int {
	for {
		c, rest, ok := sys.NextCmsg(oob)
		if !ok {
			return 0
		}
		oob = rest
		if c.Level == unix.SOL_UDP && c.Type == unix.UDP_GRO && len(c.Data) >= 4 {
			if s := *(*int32)(unsafe.Pointer(&c.Data[0])); s > 0 {
				return int(s)
			}
			return 0
		}
	}
}

// deliverGRO is deliver for buffers that may hold coalesced runs: each
// segment becomes its own frame with its own synthesized header, in place
// where the receive layout left room for one, else gathered into the
// arena behind it.
func (l *Link) deliverGRO(fn func(frames [][]byte)) int {
	frames := l.frames[:0]
	arena := l.off.arena
	p := 0
	copied := 0
	for i := 0; i < l.rn; i++ {
		m := &l.rmsgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			l.truncated.Add(1)
			continue
		}
		plen := int(m.Len)
		h := link.Header{Dst: l.macArr, TTL: synthTTL, DF: true, DstPort: l.port, DstAddr: l.addr}
		if !l.synthAddrs(i, &h) {
			continue
		}
		seg := groSegment(l.roob[i*oobSize : i*oobSize+int(m.Hdr.Controllen)])
		if seg <= 0 || seg >= plen {
			seg = plen
		} else {
			count := (plen + seg - 1) / seg
			l.off.groBuffers.Add(1)
			l.off.groDatagrams.Add(uint64(count))
			l.tallySpread(seg, count)
		}
		l.rxh.set(&h)
		hs := l.rxh.size()
		buf := l.rbufs[i]
		for off := 0; off < plen; off += seg {
			n := min(seg, plen-off)
			if n > l.off.maxDatagram {
				l.truncated.Add(1)
				continue
			}
			at, ok := l.inPlace(off, n, hs)
			if !ok {
				at, ok = l.pullTail(buf, off, n, seg, hs)
			}
			if ok {
				l.rxh.put(buf[at-hs:at], n)
				frames = append(frames, buf[at-hs:at+n])
				continue
			}
			if p+hs+n > len(arena) {
				// More segments than any kernel coalesces.
				l.truncated.Add(uint64((plen - off + seg - 1) / seg))
				break
			}
			l.rxh.put(arena[p:p+hs], n)
			l.gather(arena[p+hs:p+hs+n], buf, off)
			frames = append(frames, arena[p:p+hs+n])
			p += hs + n
			copied++
		}
	}
	if copied > 0 {
		l.off.groCopied.Add(uint64(copied))
	}
	l.frames = frames
	if len(frames) > 0 {
		fn(frames)
		clear(frames)
	}
	l.adaptSpread()
	return len(frames)
}

// inPlace reports where in its receive buffer the n-byte segment at
// offset off of the received run begins, when it lies whole there with
// room for an hs-byte header in front.
func (l *Link) inPlace(off, n, hs int) (int, bool) {
	s := l.off.spread
	if s == 0 {
		return headroom, off == 0
	}
	return l.at(off), off%s == 0 && n <= s && (off == 0 || hs <= l.off.hsize)
}

// pullTail makes whole in its receive buffer the n-byte segment at offset
// off of a run cut at seg bytes, a little more than the layout's spread:
// the segment begins in the iovec of its index, and its last bytes, which
// the kernel put at the start of the next iovec, are moved into the header
// gap behind its own when they fit there. The first two segments of a
// run 16 bytes longer than the spread do (a message's first packet carries
// a RETH, and a run that it leads is cut at its size). Segments are taken
// in order: the bytes moved belonged to no earlier frame, and the next
// segment's header lands only on bytes already moved. It reports where the
// segment begins.
func (l *Link) pullTail(buf []byte, off, n, seg, hs int) (int, bool) {
	s := l.off.spread
	if s == 0 || seg <= s || hs > l.off.hsize || off/s != off/seg {
		return 0, false
	}
	at := l.at(off)
	if first := s - off%s; n > first {
		rest := n - first
		if rest > l.off.hsize {
			return 0, false
		}
		from := l.at(off + first)
		copy(buf[at+first:at+n], buf[from:from+rest])
	}
	return at, true
}

// at is where byte off of the received run lies in its receive buffer.
func (l *Link) at(off int) int {
	s := l.off.spread
	if s == 0 {
		return headroom + off
	}
	return headroom + off/s*(l.off.hsize+s) + off%s
}

// gather copies the received run from offset off into dst, across the
// iovecs of the receive layout.
func (l *Link) gather(dst, buf []byte, off int) {
	s := l.off.spread
	if s == 0 {
		copy(dst, buf[l.at(off):])
		return
	}
	for len(dst) > 0 {
		at := l.at(off)
		c := copy(dst, buf[at:at+min(s-off%s, len(dst))])
		dst, off = dst[c:], off+c
	}
}

// tallySpread counts count coalesced datagrams of size seg for the choice
// of layout.
func (l *Link) tallySpread(seg, count int) {
	switch {
	case seg == l.off.spread:
		l.off.hits += count
	case seg >= spreadMinSegment && seg <= l.off.maxDatagram:
		l.off.misses += count
		l.off.missSeg = seg
	}
}

// adaptSpread lays the receive buffers out for the segment size most
// datagrams came in, judged every spreadWindow datagrams (at once for the
// first coalesced run of a spreadable size).
func (l *Link) adaptSpread() {
	o := &l.off
	if o.hits+o.misses < spreadWindow && (o.spread != 0 || o.misses == 0) {
		return
	}
	if o.misses > o.hits {
		l.setSpread(o.missSeg)
	}
	o.hits, o.misses = 0, 0
}

// setSpread lays every receive buffer out for segments of s bytes (0, or
// less than spreadMinSegment: one iovec for the whole buffer).
func (l *Link) setSpread(s int) {
	if s < spreadMinSegment {
		s = 0
	}
	l.off.spread = s
	k := 0
	if s > 0 {
		k = (groBufSize + s - 1) / s
	}
	for i := range l.rmsgs {
		h := &l.rmsgs[i].Hdr
		if s == 0 {
			h.Iov = &l.riovs[i]
			h.SetIovlen(1)
			continue
		}
		iovs := l.off.spreadIovs[i*spreadMaxIovs : i*spreadMaxIovs+k]
		for j := range iovs {
			iovs[j].Base = &l.rbufs[i][headroom+j*(l.off.hsize+s)]
			iovs[j].SetLen(s)
		}
		h.Iov = &iovs[0]
		h.SetIovlen(k)
	}
}
