// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"fmt"

	"github.com/goroce/goroce/roce"
)

// PerfDCKey is the DC access key both ends of a DC test use: cuObject's
// default dc_key.
const PerfDCKey = 0xffeeddcc

// dcQPs creates the DC queue pairs of a --connection DC test: a DCI that
// sends and a DCT (with an SRQ) that receives; the peer targets the DCT, so
// its number is the QPN exchanged. perftest's DC tests run only between
// ConnectX NICs; this runs between goroce peers.
func (p *perf) dcQPs(qpCap roce.QPCap) error {
	var err error
	if p.srq, err = p.pd.CreateSRQ(roce.SRQAttr{MaxWR: max(qpCap.MaxRecvWR, 1), MaxSGE: 1}); err != nil {
		return err
	}
	if p.q, err = p.pd.CreateQP(&roce.QPInitAttr{Type: roce.DCI, SendCQ: p.scq, RecvCQ: p.scq,
		Cap: roce.QPCap{MaxSendWR: qpCap.MaxSendWR, MaxSendSGE: 1}}); err != nil {
		return err
	}
	if p.dct, err = p.pd.CreateQP(&roce.QPInitAttr{Type: roce.DCT, SendCQ: p.rcq, RecvCQ: p.rcq, SRQ: p.srq,
		DC: roce.DCInitAttr{Key: PerfDCKey}}); err != nil {
		return err
	}
	return nil
}

// closeDC destroys what dcQPs created.
func (p *perf) closeDC() {
	if p.ah != nil {
		p.ah.Close()
	}
	if p.dct != nil {
		p.dct.Close()
	}
	if p.srq != nil {
		p.srq.Close()
	}
}

// connectDC activates the DCI and the DCT and makes the address handle of
// the peer's DCT.
func (p *perf) connectDC(ctx context.Context) error {
	err := p.q.ActivateDC(ctx, &roce.DCAttr{PathMTU: p.mtu, LocalPSN: p.me.PSN, Timeout: uint8(p.cfg.QPTimeout), RetryCnt: 7,
		RNRRetry: 7, RdAtomic: ourOutReads, NoDefaults: true})
	if err == nil {
		err = p.dct.ActivateDC(ctx, &roce.DCAttr{PathMTU: p.mtu, MinRNRTimer: 12, RdAtomic: ourOutReads, NoDefaults: true})
	}
	if err == nil {
		p.ah, err = p.pd.CreateAH(ctx, roce.AddressVector{DGID: p.rem.GID, SGID: p.me.GID, HopLimit: 0xFF,
			TrafficClass: uint8(p.cfg.TOS)})
	}
	if err != nil {
		return fmt.Errorf("Unable to Connect the HCA's through the link: %w", err)
	}
	return nil
}

func connName(dc bool) string {
	if dc {
		return "DC"
	}
	return "RC"
}
