// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"context"
	"fmt"
)

// Hooks are the RDMA steps a test script calls between its exchanges.
// Nil hooks are skipped.
type Hooks struct {
	// Connect brings the QP to RTS towards the peer's first record. It is
	// not called over rdma_cm, where CMConnect connected the QP.
	Connect func(ctx context.Context, rem Dest) error
	// CMConnect connects the test QP with rdma_cm (-R). It runs between
	// two handshakes of empty records, before any other, and returns this
	// side's record for the rest of the script.
	CMConnect func(ctx context.Context) (Dest, error)
	// Addresses is called once both records are known and the QP is
	// connected, where perftest prints them.
	Addresses func(local, remote Dest)
	// PrepareRecv posts the receives of a send test before the exchange
	// that lets the sender start.
	PrepareRecv func(ctx context.Context) error
	// Run is the data phase of this side. Passive sides (the server of a
	// write, read or atomic test) have none.
	Run func(ctx context.Context) (BWReport, error)
	// More are the records of this side's further QPs of a bandwidth test
	// with several (perftest -q): perftest swaps every QP's record in the
	// first handshake and in the one that prints the remote addresses, and
	// the first QP's in every other.
	More []Dest
	// ConnectMore connects the further QPs to the peer's records, after
	// Connect (not over rdma_cm).
	ConnectMore func(ctx context.Context, rem []Dest) error
	// Duplex is perftest -b for a write, read or atomic bandwidth test:
	// both sides run, then swap reports and print their sum.
	Duplex bool
}

// Outcome is what a script learned from the peer.
type Outcome struct {
	Remote Dest
	// RemoteReport is the client's report, which the server of a write,
	// read or atomic bandwidth test receives and prints as its own.
	RemoteReport *BWReport
	// Report is this side's own (from Run).
	Report BWReport
	// MoreRemote are the peer's records of its further QPs (Hooks.More).
	MoreRemote []Dest
}

// HasRun reports whether this side of the test runs a data phase.
func HasRun(verb Verb, latency bool, role Role) bool {
	if role == Client {
		return true
	}
	switch {
	case verb == Send:
		return true
	case latency && verb == Write:
		return true
	}
	return false
}

// RunScript runs the exchanges of one perftest test after Setup, in
// perftest 6.06's order, calling the hooks where the tool does its RDMA
// work:
//
//	write/read/atomic BW:  hs, connect, hs, hs; server: hs, reports, close;
//	                       client: run, hs, reports, close
//	send BW and latency:   hs, connect, hs, hs, post receives, hs, run, close
//	write latency:         hs, hs, connect, hs, hs, run (no close)
//	read/atomic latency:   hs, hs, connect, hs, hs; server: close;
//	                       client: run, close
//	write/read/atomic BW, duplex (-b): hs, connect, hs, hs, hs, run,
//	                       reports, close
//
// With several QPs (Hooks.More) the first handshake, and the one before
// (write, read, atomic) or after (send) the address lines, swap every QP's
// record in turn.
//
// Every handshake swaps the same record: the peer uses them as barriers.
// Over rdma_cm (-R) the script starts with handshake, CMConnect, handshake,
// and "connect" is a no-op.
func RunScript(ctx context.Context, c *Conn, verb Verb, latency bool, me Dest, h Hooks) (Outcome, error) {
	var out Outcome
	hs := func(step string) error {
		rem, err := c.HandShake(ctx, me)
		if err != nil {
			return fmt.Errorf("%s: %w", step, err)
		}
		out.Remote = rem
		return nil
	}
	connect := func() error {
		if h.Connect != nil {
			if err := h.Connect(ctx, out.Remote); err != nil {
				return err
			}
		}
		return nil
	}
	run := func() error {
		if h.Run != nil {
			rep, err := h.Run(ctx)
			out.Report = rep
			return err
		}
		return nil
	}
	closeTest := func() error {
		if err := c.CloseTest(ctx, me); err != nil {
			return fmt.Errorf("closing handshake: %w", err)
		}
		return nil
	}
	// hsAll swaps every QP's record, the first QP's last so that
	// out.Remote stays the peer's first.
	hsAll := func(step string) error {
		if len(h.More) == 0 {
			return hs(step)
		}
		if err := hs(step); err != nil {
			return err
		}
		first := out.Remote
		out.MoreRemote = out.MoreRemote[:0]
		for i, d := range h.More {
			rem, err := c.HandShake(ctx, d)
			if err != nil {
				return fmt.Errorf("%s (QP %d): %w", step, i+2, err)
			}
			out.MoreRemote = append(out.MoreRemote, rem)
		}
		out.Remote = first
		return nil
	}
	addresses := func() {
		if h.Addresses != nil {
			h.Addresses(me, out.Remote)
		}
	}

	if c.RDMACM() {
		// create_rdma_cm_connection: the records are still zero here.
		empty := Dest{GIDIndex: me.GIDIndex}
		if _, err := c.HandShake(ctx, empty); err != nil {
			return out, fmt.Errorf("sync before the rdma_cm connection: %w", err)
		}
		if h.CMConnect == nil {
			return out, fmt.Errorf("perftest: rdma_cm exchange without a CMConnect hook")
		}
		d, err := h.CMConnect(ctx)
		if err != nil {
			return out, err
		}
		if _, err := c.HandShake(ctx, empty); err != nil {
			return out, fmt.Errorf("sync after the rdma_cm connection: %w", err)
		}
		me = d
		h.Connect = nil
	}
	if len(h.More) > 0 && (latency || c.RDMACM()) {
		return out, fmt.Errorf("perftest: several QPs run bandwidth tests over Ethernet exchange only")
	}
	if h.Duplex && (latency || verb == Send) {
		return out, fmt.Errorf("perftest: duplex script for write, read and atomic bandwidth only")
	}
	if err := hsAll("first handshake"); err != nil {
		return out, err
	}
	// Latency tests other than send handshake twice before connecting.
	if latency && verb != Send {
		if err := hs("second handshake"); err != nil {
			return out, err
		}
	}
	if err := connect(); err != nil {
		return out, err
	}
	if len(h.More) > 0 && h.ConnectMore != nil {
		if err := h.ConnectMore(ctx, out.MoreRemote); err != nil {
			return out, err
		}
	}
	// Which of the two handshakes around the address lines carries every
	// QP's record: the first in write, read and atomic tests, the second in
	// send tests.
	if !latency || verb == Send {
		step := hs
		if verb != Send {
			step = hsAll
		}
		if err := step("handshake after connect"); err != nil {
			return out, err
		}
	}
	addresses()
	step := hs
	if verb == Send {
		step = hsAll
	}
	if err := step("handshake after printing addresses"); err != nil {
		return out, err
	}

	switch {
	case verb == Send:
		if h.PrepareRecv != nil && (latency || c.role == Server) {
			if err := h.PrepareRecv(ctx); err != nil {
				return out, err
			}
		}
		if err := hs("handshake before the run"); err != nil {
			return out, err
		}
		if err := run(); err != nil {
			return out, err
		}
		return out, closeTest()

	case latency:
		if err := hs("handshake after RTR"); err != nil {
			return out, err
		}
		if verb == Write {
			return out, run()
		}
		if c.role == Client {
			if err := run(); err != nil {
				return out, err
			}
		}
		return out, closeTest()

	case h.Duplex: // write, read, atomic bandwidth, both ways
		if err := hs("handshake before the run"); err != nil {
			return out, err
		}
		if err := run(); err != nil {
			return out, err
		}
		rem, err := c.ExchangeBWReports(ctx, out.Report)
		if err != nil {
			return out, fmt.Errorf("report exchange: %w", err)
		}
		out.RemoteReport = &rem
		return out, closeTest()

	default: // write, read, atomic bandwidth
		if c.role == Client {
			if err := run(); err != nil {
				return out, err
			}
		}
		if err := hs("handshake after the run"); err != nil {
			return out, err
		}
		rem, err := c.ExchangeBWReports(ctx, out.Report)
		if err != nil {
			return out, fmt.Errorf("report exchange: %w", err)
		}
		if c.role == Server {
			out.RemoteReport = &rem
		}
		return out, closeTest()
	}
}
