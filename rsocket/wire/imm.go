package wire

// Op is the 3-bit message type in bits 31:29 of an rsocket immediate.
type Op uint8

const (
	OpData         Op = 0 // RS_OP_DATA: bytes written, in the low 29 bits
	OpRsvdDataMore Op = 1 // RS_OP_RSVD_DATA_MORE: reserved
	OpWrite        Op = 2 // RS_OP_WRITE: local bookkeeping of riowrite, never on the wire
	OpRsvdDRAMore  Op = 3 // RS_OP_RSVD_DRA_MORE: reserved
	OpSGL          Op = 4 // RS_OP_SGL: new credit limit (peer keeps the low 16 bits)
	OpRsvd         Op = 5 // RS_OP_RSVD: reserved
	OpIOMapSGL     Op = 6 // RS_OP_IOMAP_SGL: index of the iomap entry written
	OpCtrl         Op = 7 // RS_OP_CTRL: a Ctrl value
)

var opNames = [8]string{"DATA", "RSVD_DATA_MORE", "WRITE", "RSVD_DRA_MORE", "SGL", "RSVD", "IOMAP_SGL", "CTRL"}

func (o Op) String() string { return opNames[o&7] }

// Ctrl values carried by OpCtrl.
const (
	CtrlDisconnect = 0 // RS_CTRL_DISCONNECT: imm 0xE0000000
	CtrlKeepalive  = 1 // RS_CTRL_KEEPALIVE: only a wr_id tag; keepalives are writes without immediate
	CtrlShutdown   = 2 // RS_CTRL_SHUTDOWN: imm 0xE0000002
)

// Imm is the 32-bit rsocket message, carried big-endian in the ImmDt header.
type Imm uint32

// MakeImm is rs_msg_set: op<<29 | data. Data above 29 bits is truncated
// into the op field in C; here it is masked.
func MakeImm(op Op, data uint32) Imm { return Imm(uint32(op&7)<<29 | data&ImmDataMask) }

// Op is rs_msg_op.
func (m Imm) Op() Op { return Op(m >> 29) }

// Data is rs_msg_data.
func (m Imm) Data() uint32 { return uint32(m) & ImmDataMask }

// Well-known immediates.
const (
	ImmDisconnect = Imm(uint32(OpCtrl)<<29 | CtrlDisconnect)
	ImmShutdown   = Imm(uint32(OpCtrl)<<29 | CtrlShutdown)
)

// ParseImm checks a received immediate the way a strict receiver should:
// ops 1, 2, 3, 5 are never sent (rs_poll_cq would queue 1, 3, 5 as data and
// drop 2); a DATA message of 0 bytes is never sent; CTRL must carry a known
// value; IOMAP_SGL keeps bits 28:16 zero.
func ParseImm(v uint32) (Imm, error) {
	m := Imm(v)
	switch m.Op() {
	case OpData:
		if m.Data() == 0 {
			return m, errZeroData
		}
	case OpSGL:
	case OpIOMapSGL:
		if m.Data()>>16 != 0 {
			return m, errIOMapReserved
		}
	case OpCtrl:
		if m.Data() > CtrlShutdown {
			return m, errBadCtrl
		}
	default:
		return m, errReservedOp
	}
	return m, nil
}

// ConsumesCredit reports whether a message of this op uses one of the
// peer's send credits (sseq_no++): DATA and IOMAP_SGL do; SGL and CTRL are
// control messages paced by control slots instead.
func (o Op) ConsumesCredit() bool { return o == OpData || o == OpIOMapSGL }
