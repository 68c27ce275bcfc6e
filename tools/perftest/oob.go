// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"

	"github.com/goroce/goroce/ib"
)

// Version is the perftest version whose protocol this package speaks and
// announces.
const Version = "6.06"

// Sizes of perftest's out-of-band messages.
const (
	VersionSize = 16  // char version[16]
	DestSize    = 108 // a key record with GID
	// DestBinarySize is a key record over rdma_cm: sizeof(struct
	// pingpong_dest), which is also the receive perftest keeps posted
	// there, so no rdma_cm message may be longer.
	DestBinarySize = 56
	reportField    = 8 // each bandwidth report field
)

// minVersion is the oldest peer perftest 6.06 accepts.
const minVersion = 5.70

// Default system data perftest exchanges: the page size it cycles remote
// addresses within and the cache line it aligns them to.
const (
	DefaultCycleBuffer   = 4096
	DefaultCacheLineSize = 64
)

var doneMsg = []byte("done\x00")

// Dest is one QP's record in perftest's key exchange (struct pingpong_dest
// as ethernet_write_keys prints it).
type Dest struct {
	LID      uint16
	OutReads uint16
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits
	RKey     uint32
	VAddr    uint64
	GID      ib.GID
	SRQN     uint32
	// GIDIndex travels only in binary (rdma_cm) records; perftest sends its
	// -x value there and does not read the peer's.
	GIDIndex int32
}

// Marshal returns the 108-byte record, NUL-terminated.
func (d Dest) Marshal() []byte {
	b := make([]byte, 0, DestSize)
	b = fmt.Appendf(b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN&0xFFFFFF, d.PSN&0xFFFFFF, d.RKey, d.VAddr)
	for _, g := range d.GID {
		b = fmt.Appendf(b, "%02x:", g)
	}
	b = fmt.Appendf(b, "%08x:", d.SRQN)
	return append(b, 0)
}

// ParseDest decodes a 108-byte record.
func ParseDest(b []byte) (Dest, error) {
	var d Dest
	if len(b) != DestSize {
		return d, fmt.Errorf("%w: perftest record of %d bytes, want %d", ErrBadRecord, len(b), DestSize)
	}
	if b[len(b)-1] != 0 {
		return d, fmt.Errorf("%w: perftest record not NUL-terminated", ErrBadRecord)
	}
	s, ok := strings.CutSuffix(string(b[:len(b)-1]), ":")
	if !ok {
		return d, fmt.Errorf("%w: perftest record does not end in ':'", ErrBadRecord)
	}
	f := strings.Split(s, ":")
	if len(f) != 6+16+1 {
		return d, fmt.Errorf("%w: perftest record has %d fields, want 23", ErrBadRecord, len(f))
	}
	var v [6]uint64
	for i, spec := range []struct {
		bits int
		name string
	}{{16, "LID"}, {16, "OUT_READS"}, {24, "QPN"}, {24, "PSN"}, {32, "RKEY"}, {64, "VADDR"}} {
		x, err := parseHex(f[i], spec.bits, spec.name)
		if err != nil {
			return d, err
		}
		v[i] = x
	}
	for i := range d.GID {
		x, err := parseHex(f[6+i], 8, "GID byte")
		if err != nil {
			return d, err
		}
		d.GID[i] = byte(x)
	}
	srqn, err := parseHex(f[22], 32, "SRQN")
	if err != nil {
		return d, err
	}
	d.LID, d.OutReads, d.QPN, d.PSN = uint16(v[0]), uint16(v[1]), uint32(v[2]), uint32(v[3])
	d.RKey, d.VAddr, d.SRQN = uint32(v[4]), v[5], uint32(srqn)
	return d, nil
}

// MarshalBinary returns the record as perftest's rdma_cm exchange sends it:
// struct pingpong_dest of an LP64 little-endian host with every field in
// network byte order (rdma_write_keys), padding zeroed.
func (d Dest) MarshalBinary() []byte {
	b := make([]byte, DestBinarySize)
	be := binary.BigEndian
	be.PutUint32(b[0:], uint32(d.LID))
	be.PutUint32(b[4:], uint32(d.OutReads))
	be.PutUint32(b[8:], d.QPN&0xFFFFFF)
	be.PutUint32(b[12:], d.PSN&0xFFFFFF)
	be.PutUint32(b[16:], d.RKey)
	be.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	be.PutUint32(b[48:], d.SRQN)
	be.PutUint32(b[52:], uint32(d.GIDIndex))
	return b
}

// ParseDestBinary decodes a record of perftest's rdma_cm exchange
// (rdma_read_keys). QPN and PSN keep their low 24 bits, LID and OUT_READS
// their low 16, as the text format carries them.
func ParseDestBinary(b []byte) (Dest, error) {
	var d Dest
	if len(b) != DestBinarySize {
		return d, fmt.Errorf("%w: rdma_cm record of %d bytes, want %d", ErrBadRecord, len(b), DestBinarySize)
	}
	be := binary.BigEndian
	d.LID = uint16(be.Uint32(b[0:]))
	d.OutReads = uint16(be.Uint32(b[4:]))
	d.QPN = be.Uint32(b[8:]) & 0xFFFFFF
	d.PSN = be.Uint32(b[12:]) & 0xFFFFFF
	d.RKey = be.Uint32(b[16:])
	d.VAddr = be.Uint64(b[24:])
	copy(d.GID[:], b[32:48])
	d.SRQN = be.Uint32(b[48:])
	d.GIDIndex = int32(be.Uint32(b[52:]))
	return d, nil
}

// Role says which end of the TCP connection this side is. The client
// writes first in every exchange.
type Role int

const (
	Server Role = iota
	Client
)

func (r Role) String() string {
	if r == Client {
		return "client"
	}
	return "server"
}

// ErrVersion is returned when the peer's perftest is too old to talk to.
var ErrVersion = errors.New("perftest: peer version not supported")

// Conn is perftest's control channel: a TCP connection ("Data ex. method:
// Ethernet", NewConn) or, with -R, a connected RC QP carrying one SEND per
// message ("Data ex. method: rdma_cm", NewMessageConn). Both carry the same
// exchanges in the same order; they differ in how a key record is encoded
// and in how a test is closed. Each exchange is bounded by the context given
// to it.
type Conn struct {
	c    net.Conn         // Ethernet
	msg  MessageTransport // rdma_cm
	role Role
	// RemoteVersion is the peer's version string (after ExchangeVersions).
	RemoteVersion string
	remVer        float64
}

// MessageTransport carries perftest's control messages over rdma_cm (-R):
// each message is one SEND on a connected RC QP, and the peer keeps one
// receive of DestBinarySize bytes posted for it.
type MessageTransport interface {
	// SendMessage sends b as one message and waits until it is delivered.
	SendMessage(ctx context.Context, b []byte) error
	// RecvMessage waits for the next message, copies it into b and
	// returns its length (which may exceed len(b): the rest is dropped).
	RecvMessage(ctx context.Context, b []byte) (int, error)
	Close() error
}

// NewConn wraps an established TCP connection.
func NewConn(c net.Conn, role Role) *Conn {
	return &Conn{c: c, role: role, remVer: 6.06}
}

// NewMessageConn wraps an rdma_cm control channel (perftest -R).
func NewMessageConn(t MessageTransport, role Role) *Conn {
	return &Conn{msg: t, role: role, remVer: 6.06}
}

// Role returns the side this end plays.
func (c *Conn) Role() Role { return c.role }

// RDMACM reports whether the exchange runs over rdma_cm.
func (c *Conn) RDMACM() bool { return c.msg != nil }

// Close closes the control channel.
func (c *Conn) Close() error {
	if c.msg != nil {
		return c.msg.Close()
	}
	return c.c.Close()
}

// Exchange sends my and reads len(rem) bytes into rem, in the order of the
// side's role (ctx_xchg_data).
func (c *Conn) Exchange(ctx context.Context, my, rem []byte) error {
	if c.msg == nil {
		defer deadline(ctx, c.c)()
	}
	if c.role == Client {
		if err := c.write(ctx, my); err != nil {
			return ctxErr(ctx, err)
		}
		return ctxErr(ctx, c.read(ctx, rem))
	}
	if err := c.read(ctx, rem); err != nil {
		return ctxErr(ctx, err)
	}
	return ctxErr(ctx, c.write(ctx, my))
}

func (c *Conn) write(ctx context.Context, b []byte) error {
	if c.msg != nil {
		if err := c.msg.SendMessage(ctx, b); err != nil {
			return fmt.Errorf("perftest: rdma_cm send: %w", err)
		}
		return nil
	}
	if _, err := c.c.Write(b); err != nil {
		return fmt.Errorf("perftest: out-of-band write: %w", err)
	}
	return nil
}

func (c *Conn) read(ctx context.Context, b []byte) error {
	if c.msg != nil {
		n, err := c.msg.RecvMessage(ctx, b)
		if err != nil {
			return fmt.Errorf("perftest: rdma_cm receive: %w", err)
		}
		// Both ends call the same exchanges with the same sizes; a message
		// of another size means they are no longer in step.
		if n != len(b) {
			return fmt.Errorf("%w: rdma_cm message of %d bytes, want %d", ErrBadRecord, n, len(b))
		}
		return nil
	}
	if _, err := io.ReadFull(c.c, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("perftest: out-of-band read: %w", err)
	}
	return nil
}

// ExchangeVersions swaps version strings (exchange_versions) and refuses a
// peer older than perftest accepts (check_version_compatibility).
func (c *Conn) ExchangeVersions(ctx context.Context) error {
	var my, rem [VersionSize]byte
	copy(my[:], Version)
	if err := c.Exchange(ctx, my[:], rem[:]); err != nil {
		return err
	}
	s, _, _ := bytes.Cut(rem[:], []byte{0})
	c.RemoteVersion = string(s)
	v := atof(c.RemoteVersion)
	if v < minVersion {
		return fmt.Errorf("%w: %q is older than %.2f", ErrVersion, c.RemoteVersion, minVersion)
	}
	c.remVer = v
	return nil
}

// atof reads the leading decimal number of s as C's atof does (0 if none).
func atof(s string) float64 {
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		dot = dot || s[end] == '.'
		end++
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s[:end], "."), 64)
	if err != nil {
		return 0
	}
	return v
}

// SysData swaps the cycle buffer (page) and cache line sizes and returns the
// larger of each (check_sys_data), which both ends then use to lay out
// their buffers.
func (c *Conn) SysData(ctx context.Context, cycleBuffer, cacheLine int) (int, int, error) {
	var my, rem [4]byte
	binary.BigEndian.PutUint32(my[:], uint32(cycleBuffer))
	if err := c.Exchange(ctx, my[:], rem[:]); err != nil {
		return 0, 0, err
	}
	rc := int(int32(binary.BigEndian.Uint32(rem[:])))
	binary.BigEndian.PutUint32(my[:], uint32(cacheLine))
	if err := c.Exchange(ctx, my[:], rem[:]); err != nil {
		return 0, 0, err
	}
	rl := int(int32(binary.BigEndian.Uint32(rem[:])))
	return max(cycleBuffer, rc), max(cacheLine, rl), nil
}

// MTU swaps the IB MTU codes of both ports, as a decimal string in a
// two-byte field (check_mtu), and returns the path MTU both use: the smaller,
// ignoring a peer value that is not an MTU code.
func (c *Conn) MTU(ctx context.Context, mine ib.MTU) (ib.MTU, error) {
	var my, rem [2]byte
	copy(my[:], strconv.Itoa(int(mine)))
	if err := c.Exchange(ctx, my[:], rem[:]); err != nil {
		return 0, err
	}
	s, _, _ := bytes.Cut(rem[:], []byte{0})
	r, err := strconv.Atoi(string(s))
	if err == nil && ib.MTU(r).Valid() && ib.MTU(r) < mine {
		return ib.MTU(r), nil
	}
	return mine, nil
}

// Setup runs the exchanges every test starts with: versions, system data
// and MTU. It returns the agreed cycle buffer, cache line and path MTU.
func (c *Conn) Setup(ctx context.Context, mtu ib.MTU) (cycle, cacheLine int, pathMTU ib.MTU, err error) {
	if err = c.ExchangeVersions(ctx); err != nil {
		return
	}
	if cycle, cacheLine, err = c.SysData(ctx, DefaultCycleBuffer, DefaultCacheLineSize); err != nil {
		return
	}
	pathMTU, err = c.MTU(ctx, mtu)
	return
}

// HandShake swaps key records (ctx_hand_shake): text over Ethernet, the
// binary struct over rdma_cm.
func (c *Conn) HandShake(ctx context.Context, me Dest) (Dest, error) {
	if c.msg != nil {
		var rem [DestBinarySize]byte
		if err := c.Exchange(ctx, me.MarshalBinary(), rem[:]); err != nil {
			return Dest{}, err
		}
		return ParseDestBinary(rem[:])
	}
	var rem [DestSize]byte
	if err := c.Exchange(ctx, me.Marshal(), rem[:]); err != nil {
		return Dest{}, err
	}
	return ParseDest(rem[:])
}

// BWReport is a bandwidth result as perftest exchanges it (struct
// bw_report_data without the per-port fields).
type BWReport struct {
	Size    uint64  `json:"size"`
	Iters   uint64  `json:"iterations"`
	BWPeak  float64 `json:"bw_peak"`  // MB/s or Gb/s, as reported
	BWAvg   float64 `json:"bw_avg"`   // MB/s or Gb/s, as reported
	MsgRate float64 `json:"msg_rate"` // Mpps
}

// ExchangeBWReports swaps reports (xchg_bw_reports): size, iterations, peak,
// average and message rate, each an 8-byte big-endian exchange of its own.
func (c *Conn) ExchangeBWReports(ctx context.Context, my BWReport) (BWReport, error) {
	var rem BWReport
	var a, b [reportField]byte
	itersSize := 8
	if c.remVer < 5.33 {
		itersSize = 4
	}
	xchg := func(v uint64, n int) (uint64, error) {
		if n == 4 {
			binary.BigEndian.PutUint32(a[:4], uint32(v))
		} else {
			binary.BigEndian.PutUint64(a[:], v)
		}
		if err := c.Exchange(ctx, a[:n], b[:n]); err != nil {
			return 0, err
		}
		if n == 4 {
			return uint64(binary.BigEndian.Uint32(b[:4])), nil
		}
		return binary.BigEndian.Uint64(b[:]), nil
	}
	var err error
	if rem.Size, err = xchg(my.Size, 8); err != nil {
		return rem, err
	}
	if rem.Iters, err = xchg(my.Iters, itersSize); err != nil {
		return rem, err
	}
	var x uint64
	for _, f := range []struct{ my, rem *float64 }{{&my.BWPeak, &rem.BWPeak}, {&my.BWAvg, &rem.BWAvg}, {&my.MsgRate, &rem.MsgRate}} {
		if x, err = xchg(math.Float64bits(*f.my), 8); err != nil {
			return rem, err
		}
		*f.rem = math.Float64frombits(x)
	}
	return rem, nil
}

// CloseTest ends a test (ctx_close_connection): one more handshake, then,
// over Ethernet, "done" from each side. It reads the peer's "done" if it
// comes, so closing does not reset a connection with data unread, but does
// not require it.
func (c *Conn) CloseTest(ctx context.Context, me Dest) error {
	if _, err := c.HandShake(ctx, me); err != nil {
		return err
	}
	if c.msg != nil {
		return nil
	}
	defer deadline(ctx, c.c)()
	if err := c.write(ctx, doneMsg); err != nil {
		return ctxErr(ctx, err)
	}
	var buf [5]byte
	io.ReadFull(c.c, buf[:])
	return nil
}
