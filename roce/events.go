package roce

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/goroce/goroce/internal/qp"
)

// EventType is the type of an asynchronous event (enum ibv_event_type).
type EventType = qp.EventType

// QPError says why the device moved a queue pair to the error state: the QPN,
// the event type and the status of the completion that reported the failure
// (WCRetryExcErr, WCRNRRetryExcErr, WCRemAccessErr, ...). It wraps
// ErrQPFailed.
type QPError = qp.QPError

// ErrQPFailed is wrapped by every QPError: errors.Is(qp.Err(), ErrQPFailed).
var ErrQPFailed = qp.ErrQPFailed

// Asynchronous event types (enum ibv_event_type). The device raises
// those of the first group (see AsyncEvent); the others are named for
// programs that switch on every ibverbs event.
const (
	EventCQErr            = qp.EventCQErr
	EventQPFatal          = qp.EventQPFatal
	EventQPReqErr         = qp.EventQPReqErr
	EventQPAccessErr      = qp.EventQPAccessErr
	EventPortActive       = qp.EventPortActive
	EventPortErr          = qp.EventPortErr
	EventSRQLimitReached  = qp.EventSRQLimitReached
	EventQPLastWQEReached = qp.EventQPLastWQEReached

	EventCommEst          = qp.EventCommEst
	EventSQDrained        = qp.EventSQDrained
	EventPathMig          = qp.EventPathMig
	EventPathMigErr       = qp.EventPathMigErr
	EventDeviceFatal      = qp.EventDeviceFatal
	EventLIDChange        = qp.EventLIDChange
	EventPKeyChange       = qp.EventPKeyChange
	EventSMChange         = qp.EventSMChange
	EventSRQErr           = qp.EventSRQErr
	EventClientReregister = qp.EventClientReregister
	EventGIDChange        = qp.EventGIDChange
)

// AsyncEvent is an asynchronous event (struct ibv_async_event, as
// ibv_get_async_event returns it):
//
//   - EventQPFatal, EventQPReqErr, EventQPAccessErr: the device moved QP to
//     the error state; Err is its *QPError (also QP.Err). Retry and RNR
//     retry exhaustion, a NAK received, a local protection or length error,
//     a lost completion, and (ReqErr, AccessErr) a request the QP's
//     responder refused all raise one. A caller's Modify to the error state
//     raises none.
//   - EventQPLastWQEReached: QP, attached to SRQ, entered the error state
//     and takes no more receives from the SRQ.
//   - EventSRQLimitReached: fewer receives than SRQ's armed limit remain
//     posted (SRQ.ArmLimit); the limit is disarmed.
//   - EventCQErr: a completion was lost because CQ was full.
//   - EventPortActive, EventPortErr: the interface went up or down (devices
//     opened on an interface).
type AsyncEvent struct {
	Type EventType
	QP   *QP
	SRQ  *SRQ
	CQ   *CQ
	Err  error
}

func (e AsyncEvent) String() string {
	s := e.Type.String()
	switch {
	case e.QP != nil:
		s += fmt.Sprintf(" (QP %d)", e.QP.qpn)
	case e.CQ != nil:
		s += " (CQ)"
	case e.SRQ != nil:
		s += " (SRQ)"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// events is the device's subscription list, guarded by Device.mu (events
// are raised under it, so a subscription can close its channel safely).
type events struct {
	subs []*EventSub
}

// EventSub is a subscription to the device's asynchronous events. Any number
// may exist; each gets every event raised after it was made, in order.
// Events are delivered without ever blocking the device: a subscriber whose
// buffer is full loses the event, and Lost counts it.
type EventSub struct {
	d    *Device
	c    chan AsyncEvent
	lost atomic.Uint64
	done bool // guarded by d.mu
}

// SubscribeEvents subscribes to asynchronous events with room for buffer
// undelivered ones (at least 1).
func (d *Device) SubscribeEvents(buffer int) (*EventSub, error) {
	if buffer < 1 {
		return nil, fmt.Errorf("roce: event subscription of %d entries: %w", buffer, qp.ErrInvalidArgument)
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	s := &EventSub{d: d, c: make(chan AsyncEvent, buffer)}
	d.ev.subs = append(d.ev.subs, s)
	return s, nil
}

// Events subscribes with a buffer of 64 events until ctx ends, when the
// channel is closed. Use SubscribeEvents to see how many events were lost.
func (d *Device) Events(ctx context.Context) (<-chan AsyncEvent, error) {
	s, err := d.SubscribeEvents(64)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { s.Close() })
	return s.c, nil
}

// C returns the channel events arrive on. It is closed by Close (and by the
// device's Close).
func (s *EventSub) C() <-chan AsyncEvent { return s.c }

// Lost returns how many events were dropped because the buffer was full.
func (s *EventSub) Lost() uint64 { return s.lost.Load() }

// Close ends the subscription and closes its channel.
func (s *EventSub) Close() error {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.done {
		return ErrClosed
	}
	s.done = true
	for i, x := range d.ev.subs {
		if x == s {
			d.ev.subs = slices.Delete(d.ev.subs, i, i+1)
			break
		}
	}
	close(s.c)
	return nil
}

// publish hands an event to every subscriber. Called with d.mu held, on the
// data path: it never blocks and never allocates.
func (d *Device) publish(ev AsyncEvent) {
	for _, s := range d.ev.subs {
		select {
		case s.c <- ev:
		default:
			s.lost.Add(1)
		}
	}
}

// onEvent receives the engine's events (under d.mu): it updates the objects
// the event concerns and publishes it.
func (d *Device) onEvent(ev qp.Event) {
	ae := AsyncEvent{Type: ev.Type}
	if ev.QP != nil {
		ae.QP, _ = ev.QP.Context().(*QP)
	}
	if ev.SRQ != nil {
		ae.SRQ, _ = ev.SRQ.Context().(*SRQ)
	}
	if ev.CQ != nil {
		ae.CQ, _ = ev.CQ.Context().(*CQ)
	}
	if ev.Err != nil {
		ae.Err = ev.Err
		if ae.QP != nil {
			ae.QP.fail(ev.Err)
		}
	}
	if ev.Type == EventSRQLimitReached && ae.SRQ != nil {
		select {
		case ae.SRQ.limit <- struct{}{}:
		default:
		}
	}
	d.publish(ae)
}

// initEvents connects the engine's events to the device.
func (d *Device) initEvents() {
	d.eng.SetEventHandler(d.onEvent)
}

// portChanged raises the port event of an operational state change.
func (d *Device) portChanged(up bool) {
	t := EventPortErr
	if up {
		t = EventPortActive
	}
	d.mu.Lock()
	d.publish(AsyncEvent{Type: t})
	d.mu.Unlock()
}

// closeEvents closes every subscription (the device closed).
func (d *Device) closeEvents() {
	d.mu.Lock()
	for _, s := range d.ev.subs {
		s.done = true
		close(s.c)
	}
	d.ev.subs = nil
	d.mu.Unlock()
}

// Done returns a channel closed when the device closes: for select loops
// that also wait on QP.Failed or a CQ's Ready.
func (d *Device) Done() <-chan struct{} { return d.ctx.Done() }

// Err returns why the device moved the QP to the error state, as a
// *QPError, or nil while it has not. A QP the caller moved to the error
// state (Modify, a disconnect) has no error; the error is cleared when the
// QP is reset. Safe to call from any goroutine without blocking.
func (q *QP) Err() error {
	if e := q.err.Load(); e != nil {
		return e
	}
	return nil
}

// Failed returns a channel closed when the device moves the QP to the error
// state (then Err is set). A reset QP gets a new channel; call Failed again
// after a reset.
func (q *QP) Failed() <-chan struct{} { return *q.failed.Load() }

// fail records the QP's failure; under d.mu, once per error transition.
func (q *QP) fail(e *qp.QPError) {
	if q.err.Swap(e) == nil {
		close(*q.failed.Load())
	}
}

// rearm gives a QP that returned to RESET a fresh failure channel. Called
// with d.mu held.
func (q *QP) rearm() {
	if q.err.Load() == nil {
		return
	}
	ch := make(chan struct{})
	q.failed.Store(&ch)
	q.err.Store(nil)
}
