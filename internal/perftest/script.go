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
}

// Outcome is what a script learned from the peer.
type Outcome struct {
	Remote Dest
	// RemoteReport is the client's report, which the server of a write,
	// read or atomic bandwidth test receives and prints as its own.
	RemoteReport *BWReport
	// Report is this side's own (from Run).
	Report BWReport
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

// RunScript runs the exchanges of one perftest test (one QP, a fixed
// iteration count, no duplex, no rdma_cm) after Setup, in perftest 6.06's
// order, calling the hooks where the tool does its RDMA work:
//
//	write/read/atomic BW:  hs, connect, hs, hs; server: hs, reports, close;
//	                       client: run, hs, reports, close
//	send BW and latency:   hs, connect, hs, hs, post receives, hs, run, close
//	write latency:         hs, hs, connect, hs, hs, run (no close)
//	read/atomic latency:   hs, hs, connect, hs, hs; server: close;
//	                       client: run, close
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
	if err := hs("first handshake"); err != nil {
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
	if !latency || verb == Send {
		if err := hs("handshake after connect"); err != nil {
			return out, err
		}
	}
	addresses()
	if err := hs("handshake after printing addresses"); err != nil {
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
