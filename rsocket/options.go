package rsocket

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goroce/goroce/rsocket/wire"
)

// Options mirror the rsetsockopt options librdmacm honours on a stream
// rsocket before it connects. Zero values take librdmacm's defaults, which
// the files of ConfigDir override when present (rs_configure).
type Options struct {
	// SQSize and RQSize are RDMA_SQSIZE and RDMA_RQSIZE: work requests of
	// the send and receive queue (default 384, clamped to [16, 0xFFFE]).
	// RQSize is also the number of credits granted to the peer.
	SQSize, RQSize int
	// Inline is RDMA_INLINE: data writes up to this many bytes go inline
	// (default 64). NoInline sends everything from the send buffer, as
	// rstream's bandwidth runs do.
	Inline int
	// IOMapSize is RDMA_IOMAPSIZE: how many iomap entries the peer may
	// publish to this side (default 0). It is rounded as the 8-bit scale
	// of rs_conn_data rounds it.
	IOMapSize int
	// SendBuffer and ReceiveBuffer are the values given to SO_SNDBUF and
	// SO_RCVBUF: like librdmacm the buffer is twice the value (the send
	// buffer at least 4096 bytes). Zero keeps the defaults (128 KiB each,
	// wmem_default and mem_default), which are not doubled.
	SendBuffer, ReceiveBuffer int
	// KeepAlive is SO_KEEPALIVE: every KeepAliveIdle (TCP_KEEPIDLE; default
	// /proc/sys/net/ipv4/tcp_keepalive_time, else 7200 s) the connection
	// posts a zero-length RDMA WRITE, so a dead peer surfaces as an error.
	KeepAlive     bool
	KeepAliveIdle time.Duration
	// NoDelay is TCP_NODELAY. rsockets never delay a write, so it is kept
	// only to be reported, as librdmacm keeps it.
	NoDelay bool
}

// NoInline is Options.Inline for "no inline data" (RDMA_INLINE 0).
const NoInline = -1

// ConfigDir holds librdmacm's administrator defaults (RS_CONF_DIR).
var ConfigDir = "/etc/rdma/rsocket"

// config is a resolved Options.
type config struct {
	sq, rq, inline, iomap int
	sbuf, rbuf            int
	keepalive             time.Duration // 0: off
	nodelay               bool
}

// defaults are librdmacm's statics after rs_configure.
type defaults struct {
	sq, rq, inline, iomap, wmem, mem int
}

var (
	defOnce sync.Once
	defVals defaults
)

func readConfInt(name string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(ConfigDir, name))
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < 0 {
		return 0, false
	}
	return v, true
}

// loadDefaults reads ConfigDir once, as rs_configure does on the first
// rsocket call.
func loadDefaults() defaults {
	defOnce.Do(func() {
		d := defaults{sq: wire.DefaultSQSize, rq: wire.DefaultRQSize, inline: wire.DefaultInline,
			iomap: wire.DefaultIOMapSize, wmem: wire.DefaultWMem, mem: wire.DefaultRMem}
		if v, ok := readConfInt("mem_default"); ok && v >= 1 {
			d.mem = v
		}
		if v, ok := readConfInt("wmem_default"); ok && v >= 1 {
			d.wmem = max(v, wire.MinSndBuf)
		}
		if v, ok := readConfInt("sqsize_default"); ok {
			d.sq = wire.ClampQPSize(v, 0)
		}
		if v, ok := readConfInt("rqsize_default"); ok {
			d.rq = wire.ClampQPSize(v, 0)
		}
		if v, ok := readConfInt("inline_default"); ok {
			d.inline = min(v, wire.QPMaxSize)
		}
		if v, ok := readConfInt("iomap_size"); ok {
			d.iomap = wire.IOMapSizeFromScale(wire.IOMapSizeToScale(v))
		}
		defVals = d
	})
	return defVals
}

func keepaliveIdle() time.Duration {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_keepalive_time")
	if err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			return time.Duration(v) * time.Second
		}
	}
	return 7200 * time.Second
}

// resolve applies the defaults and librdmacm's rounding to o.
func (o *Options) resolve() config {
	d := loadDefaults()
	c := config{sq: d.sq, rq: d.rq, inline: d.inline, iomap: d.iomap, sbuf: d.wmem, rbuf: d.mem, nodelay: o.NoDelay}
	if o.SQSize > 0 {
		c.sq = wire.ClampQPSize(o.SQSize, 0)
	}
	if o.RQSize > 0 {
		c.rq = wire.ClampQPSize(o.RQSize, 0)
	}
	switch {
	case o.Inline < 0:
		c.inline = 0
	case o.Inline > 0:
		c.inline = min(o.Inline, wire.QPMaxSize)
	}
	if o.IOMapSize > 0 {
		c.iomap = wire.IOMapSizeFromScale(wire.IOMapSizeToScale(min(o.IOMapSize, wire.MaxIOMapSize)))
	}
	if o.SendBuffer > 0 {
		c.sbuf = min(o.SendBuffer, maxBuffer/2) << 1
		if c.sbuf < wire.SndLowat {
			c.sbuf = wire.SndLowat << 1
		}
	}
	if o.ReceiveBuffer > 0 {
		c.rbuf = min(o.ReceiveBuffer, maxBuffer/2) << 1
	}
	// The ring is two halves, each able to take the largest write a
	// librdmacm peer cuts (it cuts at the half's end anyway).
	c.rbuf = max(c.rbuf, minRecvBuffer) &^ 1
	if o.KeepAlive {
		c.keepalive = o.KeepAliveIdle
		if c.keepalive <= 0 {
			c.keepalive = keepaliveIdle()
		}
	}
	return c
}

const (
	// maxBuffer bounds a buffer so that half of it fits the 29-bit byte
	// count of an immediate and the 32-bit SGE length.
	maxBuffer = 1 << 30
	// minRecvBuffer keeps each half at least RS_SNDLOWAT, the least a
	// librdmacm sender wants to write at once.
	minRecvBuffer = 2 * wire.SndLowat
)
