package ib

// RoCEv2 UDP source-port conventions. Receivers accept any source port; the
// port only spreads flows over ECMP paths and NIC queues.

const (
	// sportMin is the base of the RoCE source-port range
	// (IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, rxe's RXE_ROCE_V2_SPORT).
	sportMin = 0xC000
	// goldenRatio32 is the multiplier of Linux hash_32.
	goldenRatio32 = 0x61C88647
)

// RXESourcePort returns the UDP source port rxe uses for every packet of QP
// qpn: 0xC000 + hash_32(qpn, 14).
func RXESourcePort(qpn uint32) uint16 {
	return uint16(sportMin + ((qpn*goldenRatio32)>>(32-14))&0x3fff)
}

// CalcFlowLabel returns the 20-bit flow label the kernel derives from a local
// and remote QPN when the path has none (rdma_calc_flow_label; symmetric).
func CalcFlowLabel(l, r uint32) uint32 {
	v := uint64(l) * uint64(r)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & 0xfffff)
}

// FlowLabelToUDPSourcePort folds a 20-bit flow label into a RoCE source port
// the way mlx5 does (rdma_flow_label_to_udp_sport).
func FlowLabelToUDPSourcePort(fl uint32) uint16 {
	fl &= 0xfffff
	return uint16(sportMin | (fl&0x3fff ^ (fl&0xfc000)>>14))
}
