package qp

import (
	"errors"
	"strconv"
)

// EventType is the type of an asynchronous event; values and strings are
// those of libibverbs' enum ibv_event_type and ibv_event_type_str. The
// engine raises the ones listed in Event.
type EventType uint8

// Asynchronous event types (ibv_event_type).
const (
	EventCQErr            EventType = 0
	EventQPFatal          EventType = 1
	EventQPReqErr         EventType = 2
	EventQPAccessErr      EventType = 3
	EventCommEst          EventType = 4
	EventSQDrained        EventType = 5
	EventPathMig          EventType = 6
	EventPathMigErr       EventType = 7
	EventDeviceFatal      EventType = 8
	EventPortActive       EventType = 9
	EventPortErr          EventType = 10
	EventLIDChange        EventType = 11
	EventPKeyChange       EventType = 12
	EventSMChange         EventType = 13
	EventSRQErr           EventType = 14
	EventSRQLimitReached  EventType = 15
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
	numEventType                    = 19
)

var eventTypeStr = [numEventType]string{
	"CQ error",
	"local work queue catastrophic error",
	"invalid request local work queue error",
	"local access violation work queue error",
	"communication established",
	"send queue drained",
	"path migrated",
	"path migration request error",
	"local catastrophic error",
	"port active",
	"port error",
	"LID change",
	"P_Key change",
	"SM change",
	"SRQ catastrophic error",
	"SRQ limit reached",
	"last WQE reached",
	"client reregistration",
	"GID table change",
}

// String returns the ibv_event_type_str text.
func (t EventType) String() string {
	if int(t) < len(eventTypeStr) {
		return eventTypeStr[t]
	}
	return "unknown"
}

// Event is an asynchronous event (struct ibv_async_event). The engine raises:
//
//   - EventQPFatal, EventQPReqErr, EventQPAccessErr: the engine moved QP to
//     the error state (Err says why). A responder that NAKed an invalid
//     request raises EventQPReqErr, one that NAKed an access violation
//     EventQPAccessErr, every other cause EventQPFatal. Hardware reports a
//     requester's failure (retry exhaustion, a NAK received) only through
//     the failing completion; the engine raises EventQPFatal for it as well,
//     so that a connection's owner learns of it without polling. A QP the
//     caller moves to the error state raises none of the three.
//   - EventQPLastWQEReached: QP, attached to an SRQ, entered the error state
//     (by the engine or by Modify) and will take no more receives from it.
//   - EventSRQLimitReached: the posted receives of SRQ dropped below the
//     armed limit (SRQ.ArmLimit); the limit is disarmed.
//   - EventCQErr: a completion was lost because CQ was full.
type Event struct {
	Type EventType
	QP   *QP
	SRQ  *SRQ
	CQ   *CQ
	Err  *QPError
}

// ErrQPFailed is what every QPError wraps.
var ErrQPFailed = errors.New("qp: queue pair entered the error state")

// QPError says why the engine moved a queue pair to the error state.
type QPError struct {
	QPN  uint32
	Type EventType // EventQPFatal, EventQPReqErr or EventQPAccessErr
	// Status is the status of the completion that reported the failure
	// (WCRetryExcErr, WCRNRRetryExcErr, WCRemAccessErr, WCLocProtErr, ...).
	// It is WCGeneralErr when no completion reported it (CQOverflow).
	Status WCStatus
	// CQOverflow: a completion of the QP did not fit its CQ, which moves
	// the QP to the error state as in rxe.
	CQOverflow bool
}

func (e *QPError) Error() string {
	cause := e.Status.String()
	if e.CQOverflow {
		cause = "completion queue overflow (" + cause + ")"
	}
	return "qp: QP " + strconv.FormatUint(uint64(e.QPN), 10) + " entered the error state: " + cause
}

// Unwrap returns ErrQPFailed.
func (e *QPError) Unwrap() error { return ErrQPFailed }

// SetEventHandler sets the function that receives asynchronous events. It
// runs inside engine calls (Receive, Advance, Transmit, Modify, PostSend,
// ...), under whatever serialises them: it must not block and must not call
// into the engine.
func (e *Engine) SetEventHandler(fn func(Event)) { e.onEvent = fn }

func (e *Engine) raise(ev Event) {
	if e.onEvent != nil {
		e.onEvent(ev)
	}
}

// SetContext attaches a caller value to the QP (ibv_qp's qp_context); events
// carry the QP, and so the value.
func (q *QP) SetContext(v any) { q.ctx = v }

// Context returns the value SetContext attached.
func (q *QP) Context() any { return q.ctx }

// Err returns why the engine moved the QP to the error state, or nil while it
// has not (a caller's move to the error state is not a failure). It is
// cleared when the QP returns to RESET.
func (q *QP) Err() *QPError { return q.failure }

// noteCause remembers the status of an error completion: the cause of the
// error transition that follows it.
func (q *QP) noteCause(st WCStatus) {
	if st != WCSuccess && st != WCWRFlushErr && q.state != StateErr && q.cause == WCSuccess {
		q.cause = st
	}
}

// failResponder moves the QP to the error state for an error the responder
// detected and NAKed (rxe do_class_ac_error).
func (q *QP) failResponder(st WCStatus) {
	if q.state == StateErr || q.state == StateReset {
		return
	}
	q.cause = st
	q.respFault = true
	q.toError()
}

// raiseFailure records why the QP is about to enter the error state and
// raises the event. Called once per transition, by toError.
func (q *QP) raiseFailure() {
	if q.internal() {
		return
	}
	f := &QPError{QPN: q.qpn, Type: EventQPFatal, Status: q.cause, CQOverflow: q.lostWC}
	if f.Status == WCSuccess {
		f.Status = WCGeneralErr
	}
	if q.respFault {
		switch f.Status {
		case WCRemInvReqErr:
			f.Type = EventQPReqErr
		case WCRemAccessErr:
			f.Type = EventQPAccessErr
		}
	}
	q.failure = f
	q.cause, q.respFault, q.lostWC = WCSuccess, false, false
	q.e.raise(Event{Type: f.Type, QP: q, Err: f})
}

// lastWQE raises EventQPLastWQEReached for an SRQ-attached QP entering the
// error state.
func (q *QP) lastWQE() {
	if q.internal() {
		return
	}
	if q.srq != nil {
		q.e.raise(Event{Type: EventQPLastWQEReached, QP: q, SRQ: q.srq})
	}
}

// SetContext attaches a caller value to the CQ (ibv_cq's cq_context).
func (cq *CQ) SetContext(v any) { cq.ctx = v }

// Context returns the value SetContext attached.
func (cq *CQ) Context() any { return cq.ctx }

// SetContext attaches a caller value to the SRQ (ibv_srq's srq_context).
func (s *SRQ) SetContext(v any) { s.ctx = v }

// Context returns the value SetContext attached.
func (s *SRQ) Context() any { return s.ctx }

// ArmLimit arms the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a
// receive is taken and fewer than n remain posted, EventSRQLimitReached is
// raised once and the limit disarms (as in the verbs specification and rxe).
// n = 0 disarms; n larger than the queue is ErrInvalidArgument.
func (s *SRQ) ArmLimit(n int) error {
	if s.closed {
		return ErrClosed
	}
	if n < 0 || n > s.rq.depth {
		return ErrInvalidArgument
	}
	s.limit = n
	return nil
}

// Limit returns the armed limit (0 when disarmed).
func (s *SRQ) Limit() int { return s.limit }

// take takes the next receive WQE and checks the limit.
func (s *SRQ) take(dst *curRecv) bool {
	if !s.rq.take(dst) {
		return false
	}
	if s.limit > 0 && s.rq.n < s.limit {
		s.limit = 0
		s.pd.e.raise(Event{Type: EventSRQLimitReached, SRQ: s})
	}
	return true
}

// internal reports a QP the engine made for itself (one initiator's state
// inside a DCT): its failures are the DCT's business, not the caller's.
func (q *QP) internal() bool { return q.dc != nil && q.dc.role == dcContext }
