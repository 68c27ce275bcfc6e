package mad

import (
	"errors"
	"strconv"
)

// RejectReason is a REJ reason code (ib_cm.h: enum ib_cm_rej_reason). It
// implements error, so errors.Is(err, mad.RejInvalidServiceID) matches a
// *RejectError carrying that reason.
type RejectReason uint16

// REJ reason codes.
const (
	RejNoQP                      RejectReason = 1
	RejNoEEC                     RejectReason = 2
	RejNoResources               RejectReason = 3
	RejTimeout                   RejectReason = 4
	RejUnsupported               RejectReason = 5
	RejInvalidCommID             RejectReason = 6
	RejInvalidCommInstance       RejectReason = 7
	RejInvalidServiceID          RejectReason = 8
	RejInvalidTransportType      RejectReason = 9
	RejStaleConn                 RejectReason = 10
	RejRDCNotExist               RejectReason = 11
	RejInvalidGID                RejectReason = 12
	RejInvalidLID                RejectReason = 13
	RejInvalidSL                 RejectReason = 14
	RejInvalidTrafficClass       RejectReason = 15
	RejInvalidHopLimit           RejectReason = 16
	RejInvalidPacketRate         RejectReason = 17
	RejInvalidAltGID             RejectReason = 18
	RejInvalidAltLID             RejectReason = 19
	RejInvalidAltSL              RejectReason = 20
	RejInvalidAltTrafficClass    RejectReason = 21
	RejInvalidAltHopLimit        RejectReason = 22
	RejInvalidAltPacketRate      RejectReason = 23
	RejPortCMRedirect            RejectReason = 24
	RejPortRedirect              RejectReason = 25
	RejInvalidMTU                RejectReason = 26
	RejInsufficientRespResources RejectReason = 27
	RejConsumerDefined           RejectReason = 28
	RejInvalidRNRRetry           RejectReason = 29
	RejDuplicateLocalCommID      RejectReason = 30
	RejInvalidClassVersion       RejectReason = 31
	RejInvalidFlowLabel          RejectReason = 32
	RejInvalidAltFlowLabel       RejectReason = 33
	RejVendorOptionNotSupported  RejectReason = 35
)

var rejNames = [...]string{
	RejNoQP: "NO_QP", RejNoEEC: "NO_EEC", RejNoResources: "NO_RESOURCES", RejTimeout: "TIMEOUT",
	RejUnsupported: "UNSUPPORTED", RejInvalidCommID: "INVALID_COMM_ID",
	RejInvalidCommInstance: "INVALID_COMM_INSTANCE", RejInvalidServiceID: "INVALID_SERVICE_ID",
	RejInvalidTransportType: "INVALID_TRANSPORT_TYPE", RejStaleConn: "STALE_CONN",
	RejRDCNotExist: "RDC_NOT_EXIST", RejInvalidGID: "INVALID_GID", RejInvalidLID: "INVALID_LID",
	RejInvalidSL: "INVALID_SL", RejInvalidTrafficClass: "INVALID_TRAFFIC_CLASS",
	RejInvalidHopLimit: "INVALID_HOP_LIMIT", RejInvalidPacketRate: "INVALID_PACKET_RATE",
	RejInvalidAltGID: "INVALID_ALT_GID", RejInvalidAltLID: "INVALID_ALT_LID",
	RejInvalidAltSL: "INVALID_ALT_SL", RejInvalidAltTrafficClass: "INVALID_ALT_TRAFFIC_CLASS",
	RejInvalidAltHopLimit: "INVALID_ALT_HOP_LIMIT", RejInvalidAltPacketRate: "INVALID_ALT_PACKET_RATE",
	RejPortCMRedirect: "PORT_CM_REDIRECT", RejPortRedirect: "PORT_REDIRECT", RejInvalidMTU: "INVALID_MTU",
	RejInsufficientRespResources: "INSUFFICIENT_RESP_RESOURCES", RejConsumerDefined: "CONSUMER_DEFINED",
	RejInvalidRNRRetry: "INVALID_RNR_RETRY", RejDuplicateLocalCommID: "DUPLICATE_LOCAL_COMM_ID",
	RejInvalidClassVersion: "INVALID_CLASS_VERSION", RejInvalidFlowLabel: "INVALID_FLOW_LABEL",
	RejInvalidAltFlowLabel: "INVALID_ALT_FLOW_LABEL", RejVendorOptionNotSupported: "VENDOR_OPTION_NOT_SUPPORTED",
}

// String returns the kernel's name for r ("INVALID_SERVICE_ID") or its number.
func (r RejectReason) String() string {
	if int(r) < len(rejNames) && rejNames[r] != "" {
		return rejNames[r]
	}
	return "REJ_REASON_" + strconv.Itoa(int(r))
}

// Error implements error.
func (r RejectReason) Error() string { return "cm: rejected: " + r.String() }

// Is makes every RejectReason match ErrRejected.
func (r RejectReason) Is(target error) bool { return target == ErrRejected }

// ErrRejected matches every rejection (a *RejectError or a RejectReason).
var ErrRejected = errors.New("cm: connection rejected")

// RejectError is a REJ received from the peer (or synthesised locally with
// the same meaning). errors.Is(err, ErrRejected) and errors.Is(err, reason)
// both match it.
type RejectError struct {
	Reason          RejectReason
	MessageRejected MsgType
	ARI             []byte // the first ARILength bytes of the additional reject information
	PrivateData     []byte // the whole private-data area (the kernel does not send a length)
}

// RejectErrorFrom builds a *RejectError from a received REJ.
func RejectErrorFrom(b REJ) *RejectError {
	f := b.Fields()
	n := min(int(f.ARILength), ARISize)
	return &RejectError{Reason: f.Reason, MessageRejected: f.MessageRejected,
		ARI: f.ARI[:n:n], PrivateData: f.PrivateData}
}

// Error implements error.
func (e *RejectError) Error() string { return e.Reason.Error() }

// Is matches ErrRejected and the reject reason.
func (e *RejectError) Is(target error) bool {
	if target == ErrRejected {
		return true
	}
	r, ok := target.(RejectReason)
	return ok && r == e.Reason
}
