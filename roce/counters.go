package roce

import (
	"sync/atomic"

	"github.com/goroce/goroce/internal/qp"
)

// counters are the device's own event counts (the engine keeps its own;
// Counters merges both).
type counters struct {
	sentPkts, rcvdPkts   atomic.Uint64
	rdmaSends, rdmaRecvs atomic.Uint64
	sendErr              atomic.Uint64
	icrcErr, badFrame    atomic.Uint64
	badDGID, unknownQP   atomic.Uint64
	badKey, rxDropped    atomic.Uint64
	noNeighbour          atomic.Uint64
	linkErr              atomic.Uint64
	retryExc, rnrExc     atomic.Uint64
	cqOverflow           atomic.Uint64
	timerWakes           atomic.Uint64 // timer goroutine rounds (tests: no polling)
	polledPkts           atomic.Uint64 // frames a waiting goroutine read (tests: run to completion)
	corked               atomic.Uint64 // posts whose pass was left to the caller (tests: Options.TxCork)
}

// Counters are the device's hardware counters. The first group has the
// names and meaning of rxe's hw_counters
// (/sys/class/infiniband/rxe0/ports/1/hw_counters); the rest are this
// device's own.
type Counters struct {
	SentPkts            uint64 // sent_pkts: frames handed to the link
	RcvdPkts            uint64 // rcvd_pkts: frames received from the link
	DuplicateRequest    uint64 // duplicate_request: requests with a PSN already executed
	OutOfSeqRequest     uint64 // out_of_seq_request: requests past the expected PSN (NAK sent)
	RcvdSeqErr          uint64 // rcvd_seq_err: PSN sequence error NAKs received
	RcvdRNRErr          uint64 // rcvd_rnr_err: RNR NAKs received
	SendRNRErr          uint64 // send_rnr_err: RNR NAKs sent
	AckDeferred         uint64 // ack_deferred: ACKs folded into a later ACK of the same receive batch (rxe counts completer deferrals under this name)
	RetryExceededErr    uint64 // retry_exceeded_err: completions with RETRY_EXC_ERR
	RetryRNRExceededErr uint64 // retry_rnr_exceeded_err: completions with RNR_RETRY_EXC_ERR
	CompleterRetryErr   uint64 // completer_retry_err: go-back-N retransmissions started
	SendErr             uint64 // send_err: frames that could not be built or sent
	RDMASends           uint64 // rdma_sends: request packets sent
	RDMARecvs           uint64 // rdma_recvs: request packets accepted
	ICRCErr             uint64 // icrc_err: frames dropped for a bad ICRC
	BadFrame            uint64 // bad_frame: frames that are not well-formed RoCEv2
	BadDGID             uint64 // bad_dgid: frames to an address not in the GID table
	UnknownQP           uint64 // unknown_qp: packets for a QPN that does not exist
	BadKey              uint64 // bad_key: P_Key or Q_Key violations
	BadAddr             uint64 // bad_addr: RC/UC packets not from the QP's destination or not to its source
	RcvdDropped         uint64 // rcvd_dropped: packets the transport dropped otherwise
	NoNeighbour         uint64 // no_neighbour: sends or resolutions without a MAC
	LinkErr             uint64 // link_err: link read errors
	Timeouts            uint64 // timeouts: retransmit timer expiries
	CQOverflow          uint64 // cq_overflow: completions lost to full CQs
	Probes              uint64 // probes: resends of the first unacknowledged PSN after a few round trips without progress
	SpuriousProbes      uint64 // spurious_probes: probes found needless (the path had stalled, nothing was lost)
	RKeyViolation       uint64 // rkey_violation: requests refused with a remote access error NAK (R_Key of no MR or window of the QP's PD, access or range not granted)

	// Congestion control (Options.CC), under mlx5's names.
	NPECNMarked  uint64 // np_ecn_marked_roce_packets: CE-marked packets received
	NPCNPSent    uint64 // np_cnp_sent: CNPs sent
	RPCNPHandled uint64 // rp_cnp_handled: CNPs that cut a QP's rate
	RPCNPIgnored uint64 // rp_cnp_ignored: CNPs within the rate reduce monitor period, or with congestion control off
}

// CounterNames lists the counters in the order Each reports them.
var CounterNames = []string{
	"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_seq_err",
	"rcvd_rnr_err", "send_rnr_err", "ack_deferred", "retry_exceeded_err", "retry_rnr_exceeded_err",
	"completer_retry_err", "send_err", "rdma_sends", "rdma_recvs", "icrc_err", "bad_frame",
	"bad_dgid", "unknown_qp", "bad_key", "bad_addr", "rcvd_dropped", "no_neighbour", "link_err", "timeouts",
	"cq_overflow", "probes", "spurious_probes", "rkey_violation",
	"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
}

// Each calls fn for every counter with its rxe-style name.
func (c Counters) Each(fn func(name string, value uint64)) {
	v := [...]uint64{
		c.SentPkts, c.RcvdPkts, c.DuplicateRequest, c.OutOfSeqRequest, c.RcvdSeqErr,
		c.RcvdRNRErr, c.SendRNRErr, c.AckDeferred, c.RetryExceededErr, c.RetryRNRExceededErr,
		c.CompleterRetryErr, c.SendErr, c.RDMASends, c.RDMARecvs, c.ICRCErr, c.BadFrame,
		c.BadDGID, c.UnknownQP, c.BadKey, c.BadAddr, c.RcvdDropped, c.NoNeighbour, c.LinkErr, c.Timeouts,
		c.CQOverflow, c.Probes, c.SpuriousProbes, c.RKeyViolation,
		c.NPECNMarked, c.NPCNPSent, c.RPCNPHandled, c.RPCNPIgnored,
	}
	for i, name := range CounterNames {
		fn(name, v[i])
	}
}

// Map returns the counters by name.
func (c Counters) Map() map[string]uint64 {
	m := make(map[string]uint64, len(CounterNames))
	c.Each(func(n string, v uint64) { m[n] = v })
	return m
}

// Counters returns a snapshot of the device counters.
func (d *Device) Counters() Counters {
	d.mu.Lock()
	s := d.eng.Stats()
	cc := d.eng.CCStats()
	d.mu.Unlock()
	c := d.counters(s)
	c.NPECNMarked, c.NPCNPSent = cc.NPECNMarked, cc.NPCNPSent
	c.RPCNPHandled, c.RPCNPIgnored = cc.RPCNPHandled, cc.RPCNPIgnored
	return c
}

func (d *Device) counters(s qp.Stats) Counters {
	c := &d.ctr
	return Counters{
		SentPkts:            c.sentPkts.Load(),
		RcvdPkts:            c.rcvdPkts.Load(),
		DuplicateRequest:    s.DuplicateRequests,
		OutOfSeqRequest:     s.SeqNAKsSent,
		RcvdSeqErr:          s.SeqNAKsRcvd,
		RcvdRNRErr:          s.RNRNAKsRcvd,
		SendRNRErr:          s.RNRNAKsSent,
		AckDeferred:         s.AcksCoalesced,
		RetryExceededErr:    c.retryExc.Load(),
		RetryRNRExceededErr: c.rnrExc.Load(),
		CompleterRetryErr:   s.Retransmits,
		SendErr:             c.sendErr.Load() + s.ShortTxBuffer,
		RDMASends:           c.rdmaSends.Load(),
		RDMARecvs:           c.rdmaRecvs.Load(),
		ICRCErr:             c.icrcErr.Load(),
		BadFrame:            c.badFrame.Load(),
		BadDGID:             c.badDGID.Load(),
		UnknownQP:           c.unknownQP.Load(),
		BadKey:              c.badKey.Load(),
		BadAddr:             s.BadAddress,
		RcvdDropped:         c.rxDropped.Load(),
		NoNeighbour:         c.noNeighbour.Load(),
		LinkErr:             c.linkErr.Load(),
		Timeouts:            s.Timeouts,
		CQOverflow:          c.cqOverflow.Load(),
		Probes:              s.Probes,
		SpuriousProbes:      s.SpuriousProbes,
		RKeyViolation:       s.RKeyViolations,
	}
}
