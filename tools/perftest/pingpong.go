// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce/ib"
)

// PingpongMsgSize is the size of the ibv_*_pingpong address record:
// "0000:000000:000000:" and 32 hex digits of GID, NUL-terminated.
const PingpongMsgSize = 52

// pingpongDone is what the pingpong client sends last ("done" and its NUL).
var pingpongDone = []byte("done\x00")

// PingpongDest is one side's address in the pingpong exchange.
type PingpongDest struct {
	LID uint16
	QPN uint32 // 24 bits
	PSN uint32 // 24 bits
	GID ib.GID
}

// ErrBadRecord is wrapped by every error about a malformed out-of-band record.
var ErrBadRecord = errors.New("perftest: malformed out-of-band record")

// Marshal returns the 52-byte wire record.
func (d PingpongDest) Marshal() []byte {
	b := make([]byte, 0, PingpongMsgSize)
	b = fmt.Appendf(b, "%04x:%06x:%06x:", d.LID, d.QPN&0xFFFFFF, d.PSN&0xFFFFFF)
	// The tools print the GID as four 32-bit words in network order, which
	// is the 16 bytes in order.
	b = hex.AppendEncode(b, d.GID[:])
	return append(b, 0)
}

// ParsePingpongDest decodes a 52-byte record.
func ParsePingpongDest(b []byte) (PingpongDest, error) {
	var d PingpongDest
	if len(b) != PingpongMsgSize {
		return d, fmt.Errorf("%w: pingpong record of %d bytes, want %d", ErrBadRecord, len(b), PingpongMsgSize)
	}
	if b[len(b)-1] != 0 {
		return d, fmt.Errorf("%w: pingpong record not NUL-terminated", ErrBadRecord)
	}
	f := strings.Split(string(b[:len(b)-1]), ":")
	if len(f) != 4 {
		return d, fmt.Errorf("%w: pingpong record has %d fields, want 4", ErrBadRecord, len(f))
	}
	lid, err := parseHex(f[0], 16, "LID")
	if err != nil {
		return d, err
	}
	qpn, err := parseHex(f[1], 24, "QPN")
	if err != nil {
		return d, err
	}
	psn, err := parseHex(f[2], 24, "PSN")
	if err != nil {
		return d, err
	}
	if len(f[3]) != 32 {
		return d, fmt.Errorf("%w: pingpong GID %q is not 32 hex digits", ErrBadRecord, f[3])
	}
	if _, err := hex.Decode(d.GID[:], []byte(f[3])); err != nil {
		return d, fmt.Errorf("%w: pingpong GID %q: %v", ErrBadRecord, f[3], err)
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	return d, nil
}

func parseHex(s string, bits int, what string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty %s", ErrBadRecord, what)
	}
	v, err := strconv.ParseUint(s, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q: %v", ErrBadRecord, what, s, err)
	}
	return v, nil
}

// deadline applies ctx's deadline (or none) to c and returns a function that
// interrupts c's blocked I/O when ctx ends early.
func deadline(ctx context.Context, c net.Conn) (stop func()) {
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	} else {
		c.SetDeadline(time.Time{})
	}
	cancel := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() { cancel() }
}

// ctxErr prefers ctx's error to the I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	// The connection's deadline is the context's: it may fire first.
	if d, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(d) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

// PingpongClient runs the client side on an established connection: send
// our record, read the server's, send "done". The server has connected its
// QP before it answers, so the caller may connect and send right after.
func PingpongClient(ctx context.Context, c net.Conn, me PingpongDest) (PingpongDest, error) {
	defer deadline(ctx, c)()
	if _, err := c.Write(me.Marshal()); err != nil {
		return PingpongDest{}, ctxErr(ctx, fmt.Errorf("perftest: send local address: %w", err))
	}
	buf := make([]byte, PingpongMsgSize)
	if _, err := io.ReadFull(c, buf); err != nil {
		return PingpongDest{}, ctxErr(ctx, fmt.Errorf("perftest: read remote address: %w", err))
	}
	rem, err := ParsePingpongDest(buf)
	if err != nil {
		return rem, err
	}
	if _, err := c.Write(pingpongDone); err != nil {
		return rem, ctxErr(ctx, fmt.Errorf("perftest: send done: %w", err))
	}
	return rem, nil
}

// PingpongServer runs the server side on an accepted connection: read the
// client's record, call connect with it (the QP must be ready to receive
// before the client learns our address, since it sends at once), send our
// record and wait for "done".
func PingpongServer(ctx context.Context, c net.Conn, me PingpongDest, connect func(PingpongDest) error) (PingpongDest, error) {
	defer deadline(ctx, c)()
	buf := make([]byte, PingpongMsgSize)
	if _, err := io.ReadFull(c, buf); err != nil {
		return PingpongDest{}, ctxErr(ctx, fmt.Errorf("perftest: read remote address: %w", err))
	}
	rem, err := ParsePingpongDest(buf)
	if err != nil {
		return rem, err
	}
	if connect != nil {
		if err := connect(rem); err != nil {
			return rem, err
		}
	}
	if _, err := c.Write(me.Marshal()); err != nil {
		return rem, ctxErr(ctx, fmt.Errorf("perftest: send local address: %w", err))
	}
	done := make([]byte, len(pingpongDone))
	if _, err := io.ReadFull(c, done); err != nil {
		return rem, ctxErr(ctx, fmt.Errorf("perftest: read done: %w", err))
	}
	if string(done) != string(pingpongDone) {
		return rem, fmt.Errorf("%w: expected \"done\", got %q", ErrBadRecord, done)
	}
	return rem, nil
}

// PingpongAddrLine formats the tools' "  local address:  ..." or
// "  remote address: ..." line (with its newline). ibv_ud_pingpong prints a
// colon instead of a comma before the GID on its local line; udLocal selects
// that form.
func PingpongAddrLine(remote, udLocal bool, d PingpongDest) string {
	if remote {
		return fmt.Sprintf("  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", d.LID, d.QPN, d.PSN, d.GID)
	}
	sep := ","
	if udLocal {
		sep = ":"
	}
	return fmt.Sprintf("  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n", d.LID, d.QPN, d.PSN, sep, d.GID)
}

// PingpongResult formats the two result lines of the pingpong tools for
// size-byte messages, iters round trips and the elapsed time. Like the
// tools, it works in microseconds held in a float32 and counts the bytes of
// both directions.
func PingpongResult(size, iters int, elapsed time.Duration) string {
	usec := float32(elapsed.Microseconds())
	bytes := int64(size) * int64(iters) * 2
	return fmt.Sprintf("%d bytes in %.2f seconds = %.2f Mbit/sec\n%d iters in %.2f seconds = %.2f usec/iter\n",
		bytes, float64(usec)/1e6, float64(bytes)*8/float64(usec),
		iters, float64(usec)/1e6, float64(usec/float32(iters)))
}
