package qp

import (
	"errors"
	"strconv"

	"github.com/goroce/goroce/internal/errclosed"
)

// WCStatus is the status of a work completion; values and strings are those of
// libibverbs' enum ibv_wc_status and ibv_wc_status_str.
type WCStatus uint8

// Work completion statuses (ibv_wc_status).
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRDReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
	numWCStatus                 = 24
)

var wcStatusStr = [numWCStatus]string{
	"success",
	"local length error",
	"local QP operation error",
	"local EE context operation error",
	"local protection error",
	"Work Request Flushed Error",
	"memory management operation error",
	"bad response error",
	"local access error",
	"remote invalid request error",
	"remote access error",
	"remote operation error",
	"transport retry counter exceeded",
	"RNR retry counter exceeded",
	"local RDD violation error",
	"remote invalid RD request",
	"aborted error",
	"invalid EE context number",
	"invalid EE context state",
	"fatal error",
	"response timeout error",
	"general error",
	"TM error",
	"TM software rendezvous",
}

// String returns the ibv_wc_status_str text.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusStr) {
		return wcStatusStr[s]
	}
	return "unknown"
}

// WCOpcode is the operation a work completion reports (ibv_wc_opcode).
type WCOpcode uint8

// Work completion opcodes (ibv_wc_opcode). Receive opcodes have bit 7 set.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCFlush           WCOpcode = 8
	WCAtomicWrite     WCOpcode = 9
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// String returns the ibverbs enumerator name without the IBV_WC_ prefix.
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCAtomicWrite:
		return "ATOMIC_WRITE"
	case WCFlush:
		return "FLUSH"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WCOpcode(" + strconv.Itoa(int(o)) + ")"
}

// WCFlags are ibv_wc_flags.
type WCFlags uint8

// Work completion flags (ibv_wc_flags).
const (
	WCWithGRH  WCFlags = 1
	WCWithImm  WCFlags = 2
	WCIPCsumOK WCFlags = 4
	WCWithInv  WCFlags = 8
)

// WorkCompletion is one entry of a completion queue (struct ibv_wc).
type WorkCompletion struct {
	WRID            uint64
	Status          WCStatus
	Opcode          WCOpcode
	VendorErr       uint32
	ByteLen         uint32
	Imm             uint32 // immediate data, the wire value as an integer (ntohl of ibv_wc.imm_data); valid with WCWithImm
	InvalidatedRKey uint32 // valid with WCWithInv
	QPN             uint32 // the local QP
	SrcQP           uint32 // UD: the sender's QPN
	Flags           WCFlags
	PKeyIndex       uint16
}

// WROpcode is a send work request opcode (ibv_wr_opcode).
type WROpcode uint8

// Send work request opcodes (ibv_wr_opcode).
const (
	WRRDMAWrite         WROpcode = 0
	WRRDMAWriteWithImm  WROpcode = 1
	WRSend              WROpcode = 2
	WRSendWithImm       WROpcode = 3
	WRRDMARead          WROpcode = 4
	WRAtomicCmpAndSwp   WROpcode = 5
	WRAtomicFetchAndAdd WROpcode = 6
	WRLocalInv          WROpcode = 7
	WRBindMW            WROpcode = 8
	WRSendWithInv       WROpcode = 9
	WRFlush             WROpcode = 14 // FLUSH (IBTA 1.5 memory placement; rxe ≥ 6.2)
	WRAtomicWrite       WROpcode = 15 // 8 bytes written atomically (IBTA 1.5; rxe ≥ 6.2)
)

var wrOpcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW", "SEND_WITH_INV"}

// String returns the ibverbs enumerator name without the IBV_WR_ prefix.
func (o WROpcode) String() string {
	if int(o) < len(wrOpcodeNames) {
		return wrOpcodeNames[o]
	}
	switch o {
	case WRAtomicWrite:
		return "ATOMIC_WRITE"
	case WRFlush:
		return "FLUSH"
	}
	return "WROpcode(" + strconv.Itoa(int(o)) + ")"
}

// SendFlags are ibv_send_flags.
type SendFlags uint8

// Send flags (ibv_send_flags).
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// Access are memory region / QP access flags (ibv_access_flags).
type Access uint32

// Access flags (ibv_access_flags values).
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
	// AccessFlushGlobal allows remote FLUSH with the global-visibility
	// placement type. Persistence (IBV_ACCESS_FLUSH_PERSISTENT, 512) cannot be
	// offered for ordinary Go memory and is refused by RegMR.
	AccessFlushGlobal     Access = 256
	AccessFlushPersistent Access = 512
	// AccessMWBind lets memory windows be bound to the region
	// (IBV_ACCESS_MW_BIND).
	AccessMWBind Access = 16
	accessAll           = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessFlushGlobal | AccessMWBind
)

// QPType is the transport service of a queue pair (ibv_qp_type values).
type QPType uint8

// Queue pair types. GSI is the special UD queue pair number 1 that carries
// management datagrams (CM); it uses Q_Key GSIQKey.
const (
	GSI QPType = 1
	RC  QPType = 2
	UC  QPType = 3
	UD  QPType = 4
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	case GSI:
		return "GSI"
	case DCI:
		return "DCI"
	case DCT:
		return "DCT"
	}
	return "QPType(" + strconv.Itoa(int(t)) + ")"
}

// QPState is a queue pair state (ibv_qp_state values).
type QPState uint8

// Queue pair states.
const (
	StateReset QPState = 0
	StateInit  QPState = 1
	StateRTR   QPState = 2
	StateRTS   QPState = 3
	StateSQD   QPState = 4
	StateSQE   QPState = 5
	StateErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateRTR:
		return "RTR"
	case StateRTS:
		return "RTS"
	case StateSQD:
		return "SQD"
	case StateSQE:
		return "SQE"
	case StateErr:
		return "ERR"
	}
	return "QPState(" + strconv.Itoa(int(s)) + ")"
}

// AttrMask selects the QPAttr fields a Modify call sets (ibv_qp_attr_mask values).
type AttrMask uint32

// Attribute mask bits.
const (
	AttrState            AttrMask = 1 << 0
	AttrCurState         AttrMask = 1 << 1
	AttrEnSQDAsyncNotify AttrMask = 1 << 2
	AttrAccessFlags      AttrMask = 1 << 3
	AttrPKeyIndex        AttrMask = 1 << 4
	AttrPort             AttrMask = 1 << 5
	AttrQKey             AttrMask = 1 << 6
	AttrAV               AttrMask = 1 << 7
	AttrPathMTU          AttrMask = 1 << 8
	AttrTimeout          AttrMask = 1 << 9
	AttrRetryCnt         AttrMask = 1 << 10
	AttrRNRRetry         AttrMask = 1 << 11
	AttrRQPSN            AttrMask = 1 << 12
	AttrMaxQPRdAtomic    AttrMask = 1 << 13
	AttrAltPath          AttrMask = 1 << 14
	AttrMinRNRTimer      AttrMask = 1 << 15
	AttrSQPSN            AttrMask = 1 << 16
	AttrMaxDestRdAtomic  AttrMask = 1 << 17
	AttrPathMigState     AttrMask = 1 << 18
	AttrCap              AttrMask = 1 << 19
	AttrDestQPN          AttrMask = 1 << 20
)

var attrNames = [...]string{"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX",
	"PORT", "QKEY", "AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "RQ_PSN", "MAX_QP_RD_ATOMIC",
	"ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN"}

func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	s := ""
	for i, n := range attrNames {
		if m&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := m &^ (1<<len(attrNames) - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += "0x" + strconv.FormatUint(uint64(rest), 16)
	}
	return s
}

// Errors returned by verbs calls. They are sentinels so errors.Is works;
// richer errors wrap them.
var (
	ErrInvalidArgument = errors.New("qp: invalid argument")
	ErrInvalidState    = errors.New("qp: operation not allowed in the QP's current state")
	ErrInvalidAttr     = errors.New("qp: invalid QP attribute")
	ErrQueueFull       = errors.New("qp: work queue full")
	ErrTooManySGE      = errors.New("qp: too many scatter/gather elements")
	ErrInlineTooLarge  = errors.New("qp: inline data exceeds max_inline_data")
	ErrMessageTooLarge = errors.New("qp: message exceeds the maximum message size")
	ErrOpNotSupported  = errors.New("qp: operation not supported by this QP type")
	ErrBusy            = errors.New("qp: object still in use")
	// ErrClosed matches net.ErrClosed and every other goroce ErrClosed.
	ErrClosed      = errclosed.New("qp: object destroyed")
	ErrWrongPD     = errors.New("qp: objects belong to different protection domains")
	ErrNoResources = errors.New("qp: out of resources")
)

// Reasons a received packet was dropped (returned by Engine.Receive). A drop
// is normal protocol behaviour for several of them; the device only counts.
var (
	ErrUnknownQP      = errors.New("qp: packet for an unknown QP")
	ErrWrongTransport = errors.New("qp: opcode transport does not match the QP type")
	ErrBadPKey        = errors.New("qp: P_Key mismatch")
	ErrBadQKey        = errors.New("qp: Q_Key mismatch")
	ErrBadHeader      = errors.New("qp: malformed transport header")
	ErrNotReady       = errors.New("qp: QP not in a state that accepts this packet")
	ErrDropped        = errors.New("qp: packet dropped by the transport rules")
	// ErrBadAddress: an RC/UC packet whose IP source is not the QP's
	// destination or whose IP destination is not its source (rxe check_addr).
	ErrBadAddress = errors.New("qp: packet addresses do not match the QP's address vector")
)

// AttrError reports which attribute a Modify call rejected.
type AttrError struct {
	Attr   AttrMask
	Reason string
}

func (e *AttrError) Error() string {
	return "qp: invalid QP attribute " + e.Attr.String() + ": " + e.Reason
}

// Unwrap returns ErrInvalidAttr.
func (e *AttrError) Unwrap() error { return ErrInvalidAttr }
