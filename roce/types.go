package roce

import (
	"errors"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/errclosed"
	"github.com/goroce/goroce/internal/qp"
)

// Plain data types of the transport engine (internal/qp, which only this
// package may import), re-exported as aliases: they are this package's API,
// and a value passes to the engine unconverted. Objects with behaviour (PD,
// MR, MW, CQ, QP, AH, SRQ) are wrapped instead, because the engine is
// single-threaded and the device serialises every call into it.
//
// The re-export is complete, and a test keeps it so: every engine type this
// package's API reaches, every constant of those types and every error a
// verbs call returns has a name here, the same name as in the engine.
type (
	// GID is a 16-byte global identifier: on RoCEv2 an IPv6 or IPv4-mapped address.
	GID = ib.GID
	// AddressVector says where packets of a connected QP go (struct ibv_ah_attr
	// with the GIDs in place of GID indices; see Device.GID).
	AddressVector = qp.AddressVector
	// QPAttr holds the modifiable attributes of a queue pair (struct ibv_qp_attr).
	QPAttr = qp.QPAttr
	// PSNRejects counts the requests a QP refused for their PSN.
	PSNRejects = qp.PSNRejects
	// AttrMask selects the QPAttr fields Modify sets (ibv_qp_attr_mask).
	AttrMask = qp.AttrMask
	// QPCap sizes a queue pair's work queues.
	QPCap = qp.QPCap
	// QPType is RC, UC or UD.
	QPType = qp.QPType
	// QPState is a queue pair state (ibv_qp_state).
	QPState = qp.QPState
	// Access are memory region and QP access flags (ibv_access_flags).
	Access = qp.Access
	// SGE is a scatter/gather element: Length bytes at Addr in the MR with LKey.
	SGE = qp.SGE
	// RecvWR is a receive work request.
	RecvWR = qp.RecvWR
	// SendWR is a send work request (struct ibv_send_wr, one at a time).
	// Its AH, MW and Bind.MR take this package's *AH, *MW and *MR; a
	// post hands it to the engine as it is, without a copy.
	SendWR = qp.SendWR
	// MWBindInfo says what a window is bound to (struct ibv_mw_bind_info):
	// Length bytes at Addr of MR (an *MR) with the given remote access. MR
	// must allow AccessMWBind, and AccessLocalWrite for a writable window.
	// A zero Length unbinds a type 1 window (MR may then be nil).
	MWBindInfo = qp.MWBindInfo
	// MWBind is a type 1 bind request (struct ibv_mw_bind).
	MWBind = qp.MWBind
	// AHRef is what SendWR.AH holds: an *AH.
	AHRef = qp.AHRef
	// MWRef is what SendWR.MW holds: an *MW.
	MWRef = qp.MWRef
	// MRRef is what MWBindInfo.MR holds: an *MR.
	MRRef = qp.MRRef
	// SendFlags are ibv_send_flags.
	SendFlags = qp.SendFlags
	// WROpcode is a send work request opcode (ibv_wr_opcode).
	WROpcode = qp.WROpcode
	// WorkCompletion is one completion queue entry (struct ibv_wc).
	WorkCompletion = qp.WorkCompletion
	// WCStatus is a completion status with the ibv_wc_status names.
	WCStatus = qp.WCStatus
	// WCOpcode is the operation a completion reports (ibv_wc_opcode).
	WCOpcode = qp.WCOpcode
	// WCFlags are ibv_wc_flags.
	WCFlags = qp.WCFlags
	// SRQAttr sizes a shared receive queue.
	SRQAttr = qp.SRQAttr
	// MWType is a memory window type (ibv_mw_type).
	MWType = qp.MWType
	// AttrError is the error QP.Modify wraps for an invalid attribute or
	// transition: which mask bit and why (errors.As).
	AttrError = qp.AttrError
)

// ahRef, mwRef and mrRef, embedded in AH, MW and MR, let those stand for
// the engine's objects in a work request.
type (
	ahRef = qp.Ref[qp.AH]
	mwRef = qp.Ref[qp.MW]
	mrRef = qp.Ref[qp.MR]
)

var (
	_ AHRef = (*AH)(nil)
	_ MWRef = (*MW)(nil)
	_ MRRef = (*MR)(nil)
)

// Queue pair types. GSI is QP1, which the connection manager holds.
const (
	GSI = qp.GSI
	RC  = qp.RC
	UC  = qp.UC
	UD  = qp.UD
)

// GSIQKey is the Q_Key of QP1 (IB_QP1_QKEY), which MADs to and from the
// connection manager carry.
const GSIQKey = qp.GSIQKey

// Device limits, as rxe advertises them: a QPCap, CQ or SRQ beyond them is
// refused with ErrInvalidArgument.
const (
	MaxMsgSize  = qp.MaxMsgSize  // largest message
	MaxSGE      = qp.MaxSGE      // scatter/gather elements per work request
	MaxInline   = qp.MaxInline   // inline bytes per send work request
	MaxQPWR     = qp.MaxQPWR     // work requests per queue
	MaxCQE      = qp.MaxCQE      // completion queue entries
	MaxRdAtomic = qp.MaxRdAtomic // outstanding READs and atomics (max_qp_rd_atom)
)

// Queue pair states.
const (
	StateReset = qp.StateReset
	StateInit  = qp.StateInit
	StateRTR   = qp.StateRTR
	StateRTS   = qp.StateRTS
	StateSQD   = qp.StateSQD
	StateSQE   = qp.StateSQE
	StateErr   = qp.StateErr
)

// Access flags.
const (
	AccessLocalWrite   = qp.AccessLocalWrite
	AccessRemoteWrite  = qp.AccessRemoteWrite
	AccessRemoteRead   = qp.AccessRemoteRead
	AccessRemoteAtomic = qp.AccessRemoteAtomic
	// FLUSH placement types (IBTA 1.5); the engine refuses persistent.
	AccessFlushGlobal     = qp.AccessFlushGlobal
	AccessFlushPersistent = qp.AccessFlushPersistent
	// AccessMWBind lets memory windows be bound to a region.
	AccessMWBind = qp.AccessMWBind
)

// Memory window types: type 1 is bound with QP.BindMW, type 2 by a
// WRBindMW work request and then usable through the binding QP only.
const (
	MWType1 = qp.MWType1
	MWType2 = qp.MWType2
)

// Attribute mask bits.
const (
	AttrState            = qp.AttrState
	AttrCurState         = qp.AttrCurState
	AttrEnSQDAsyncNotify = qp.AttrEnSQDAsyncNotify
	AttrAccessFlags      = qp.AttrAccessFlags
	AttrPKeyIndex        = qp.AttrPKeyIndex
	AttrPort             = qp.AttrPort
	AttrQKey             = qp.AttrQKey
	AttrAV               = qp.AttrAV
	AttrPathMTU          = qp.AttrPathMTU
	AttrTimeout          = qp.AttrTimeout
	AttrRetryCnt         = qp.AttrRetryCnt
	AttrRNRRetry         = qp.AttrRNRRetry
	AttrRQPSN            = qp.AttrRQPSN
	AttrMaxQPRdAtomic    = qp.AttrMaxQPRdAtomic
	AttrAltPath          = qp.AttrAltPath
	AttrMinRNRTimer      = qp.AttrMinRNRTimer
	AttrSQPSN            = qp.AttrSQPSN
	AttrMaxDestRdAtomic  = qp.AttrMaxDestRdAtomic
	AttrPathMigState     = qp.AttrPathMigState
	AttrCap              = qp.AttrCap
	AttrDestQPN          = qp.AttrDestQPN
)

// Send work request opcodes.
const (
	WRRDMAWrite         = qp.WRRDMAWrite
	WRRDMAWriteWithImm  = qp.WRRDMAWriteWithImm
	WRSend              = qp.WRSend
	WRSendWithImm       = qp.WRSendWithImm
	WRRDMARead          = qp.WRRDMARead
	WRAtomicCmpAndSwp   = qp.WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd = qp.WRAtomicFetchAndAdd
	WRLocalInv          = qp.WRLocalInv
	WRBindMW            = qp.WRBindMW
	WRSendWithInv       = qp.WRSendWithInv
	WRFlush             = qp.WRFlush
	WRAtomicWrite       = qp.WRAtomicWrite
)

// Send flags.
const (
	SendFence     = qp.SendFence
	SendSignaled  = qp.SendSignaled
	SendSolicited = qp.SendSolicited
	SendInline    = qp.SendInline
)

// Work completion statuses (ibv_wc_status).
const (
	WCSuccess          = qp.WCSuccess
	WCLocLenErr        = qp.WCLocLenErr
	WCLocQPOpErr       = qp.WCLocQPOpErr
	WCLocEECOpErr      = qp.WCLocEECOpErr
	WCLocProtErr       = qp.WCLocProtErr
	WCWRFlushErr       = qp.WCWRFlushErr
	WCMWBindErr        = qp.WCMWBindErr
	WCBadRespErr       = qp.WCBadRespErr
	WCLocAccessErr     = qp.WCLocAccessErr
	WCRemInvReqErr     = qp.WCRemInvReqErr
	WCRemAccessErr     = qp.WCRemAccessErr
	WCRemOpErr         = qp.WCRemOpErr
	WCRetryExcErr      = qp.WCRetryExcErr
	WCRNRRetryExcErr   = qp.WCRNRRetryExcErr
	WCLocRDDViolErr    = qp.WCLocRDDViolErr
	WCRemInvRDReqErr   = qp.WCRemInvRDReqErr
	WCRemAbortErr      = qp.WCRemAbortErr
	WCInvEECNErr       = qp.WCInvEECNErr
	WCInvEECStateErr   = qp.WCInvEECStateErr
	WCFatalErr         = qp.WCFatalErr
	WCRespTimeoutErr   = qp.WCRespTimeoutErr
	WCGeneralErr       = qp.WCGeneralErr
	WCTMErr            = qp.WCTMErr
	WCTMRndvIncomplete = qp.WCTMRndvIncomplete
)

// Work completion opcodes.
const (
	WCSend            = qp.WCSend
	WCRDMAWrite       = qp.WCRDMAWrite
	WCRDMARead        = qp.WCRDMARead
	WCCompSwap        = qp.WCCompSwap
	WCFetchAdd        = qp.WCFetchAdd
	WCBindMW          = qp.WCBindMW
	WCLocalInv        = qp.WCLocalInv
	WCFlush           = qp.WCFlush
	WCAtomicWrite     = qp.WCAtomicWrite
	WCRecv            = qp.WCRecv
	WCRecvRDMAWithImm = qp.WCRecvRDMAWithImm
)

// Work completion flags.
const (
	WCWithGRH  = qp.WCWithGRH
	WCWithImm  = qp.WCWithImm
	WCIPCsumOK = qp.WCIPCsumOK
	WCWithInv  = qp.WCWithInv
)

// GRHSize is the area at the start of every UD receive buffer that receives
// the network header of the datagram (IPv6 header, or 20 zero bytes and the
// IPv4 header), as rxe and hardware do.
const GRHSize = 40

// Errors of the verbs calls, returned (wrapped) by the engine and passed
// through by the device: the engine's own values.
var (
	ErrInvalidArgument = qp.ErrInvalidArgument
	ErrInvalidState    = qp.ErrInvalidState
	ErrInvalidAttr     = qp.ErrInvalidAttr
	ErrQueueFull       = qp.ErrQueueFull
	ErrTooManySGE      = qp.ErrTooManySGE
	ErrInlineTooLarge  = qp.ErrInlineTooLarge
	ErrMessageTooLarge = qp.ErrMessageTooLarge
	ErrOpNotSupported  = qp.ErrOpNotSupported
	ErrBusy            = qp.ErrBusy
	ErrWrongPD         = qp.ErrWrongPD
	ErrNoResources     = qp.ErrNoResources
)

// Errors of the device layer.
var (
	// ErrClosed matches net.ErrClosed and the ErrClosed of every other
	// goroce package (qp, link, cm...) under errors.Is.
	ErrClosed        = errclosed.New("roce: device or object closed")
	ErrNoAddress     = errors.New("roce: interface has no usable IP address")
	ErrNoNeighbour   = errors.New("roce: neighbour could not be resolved")
	ErrNoGID         = errors.New("roce: no such GID")
	ErrMTU           = errors.New("roce: path MTU larger than the link carries")
	ErrWrongDevice   = errors.New("roce: object belongs to another device")
	ErrNotSupported  = errors.New("roce: not supported")
	ErrInvalidConfig = errors.New("roce: invalid option")
)

// devErr reports an engine object's closed error (qp.ErrClosed) as the
// device's ErrClosed, so a roce caller sees roce's message; both match
// net.ErrClosed and each other either way.
func devErr(err error) error {
	if err != nil && err != ErrClosed && errors.Is(err, ErrClosed) {
		return ErrClosed
	}
	return err
}
