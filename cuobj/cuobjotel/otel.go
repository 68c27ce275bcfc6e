// Package cuobjotel exports a cuObject client's and server's telemetry as
// OpenTelemetry metrics: their counters (ClientStats, ServerStats) as
// observable counters read at each collection, and their telemetry
// messages (errors, failovers, refused requests, ...) as a counter of
// events by component, level and message, through a slog.Handler that
// goes into cuobj.Telemetry.Logger. It lives apart so that package cuobj
// does not depend on OpenTelemetry.
//
// Instruments (meter "github.com/goroce/goroce/cuobj"):
//
//	cuobj.server.requests{op="get"|"put"}       requests completed
//	cuobj.server.bytes{op}                      bytes moved (By)
//	cuobj.server.failed, .resets, .refused      failed completions, QP resets, refused requests
//	cuobj.client.requests{op}, cuobj.client.bytes{op}
//	cuobj.client.callbacks, .retries, .connections, .refused, .failovers, .failbacks
//	cuobj.events{component, level, msg}         telemetry messages
package cuobjotel

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/goroce/goroce/cuobj"
)

// MeterName is the instrumentation scope of every instrument.
const MeterName = "github.com/goroce/goroce/cuobj"

type counter struct {
	name, unit, desc string
	attrs            attribute.Set
	v                *atomic.Uint64
}

func register(mp metric.MeterProvider, cs []counter, extra []attribute.KeyValue) (metric.Registration, error) {
	if mp == nil {
		return nil, errors.New("cuobjotel: nil MeterProvider")
	}
	m := mp.Meter(MeterName)
	type inst struct {
		o metric.Int64ObservableCounter
		c counter
	}
	byName := map[string]metric.Int64ObservableCounter{}
	var insts []inst
	var obs []metric.Observable
	for _, c := range cs {
		o, ok := byName[c.name]
		if !ok {
			var err error
			o, err = m.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
			if err != nil {
				return nil, err
			}
			byName[c.name] = o
			obs = append(obs, o)
		}
		kv := append(c.attrs.ToSlice(), extra...)
		c.attrs = attribute.NewSet(kv...)
		insts = append(insts, inst{o, c})
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, in := range insts {
			o.ObserveInt64(in.o, int64(in.c.v.Load()), metric.WithAttributeSet(in.c.attrs))
		}
		return nil
	}, obs...)
}

var (
	opGet = attribute.NewSet(attribute.String("op", "get"))
	opPut = attribute.NewSet(attribute.String("op", "put"))
	none  = attribute.NewSet()
)

// RegisterServer exports s's counters until the registration is
// unregistered; attrs are added to every point (a server name, say).
func RegisterServer(mp metric.MeterProvider, s *cuobj.Server, attrs ...attribute.KeyValue) (metric.Registration, error) {
	st := s.Stats()
	return register(mp, []counter{
		{"cuobj.server.requests", "{request}", "requests completed", opGet, &st.Gets},
		{"cuobj.server.requests", "{request}", "requests completed", opPut, &st.Puts},
		{"cuobj.server.bytes", "By", "bytes moved by RDMA", opGet, &st.GetBytes},
		{"cuobj.server.bytes", "By", "bytes moved by RDMA", opPut, &st.PutBytes},
		{"cuobj.server.failed", "{completion}", "failed completions", none, &st.Failed},
		{"cuobj.server.resets", "{reset}", "QP resets after failures", none, &st.Resets},
		{"cuobj.server.refused", "{request}", "requests refused before submission", none, &st.Refused},
	}, attrs)
}

// RegisterClient exports c's counters; as RegisterServer.
func RegisterClient(mp metric.MeterProvider, c *cuobj.Client, attrs ...attribute.KeyValue) (metric.Registration, error) {
	st := c.Stats()
	return register(mp, []counter{
		{"cuobj.client.requests", "{request}", "Get and Put calls completed", opGet, &st.Gets},
		{"cuobj.client.requests", "{request}", "Get and Put calls completed", opPut, &st.Puts},
		{"cuobj.client.bytes", "By", "bytes the callbacks reported", opGet, &st.GetBytes},
		{"cuobj.client.bytes", "By", "bytes the callbacks reported", opPut, &st.PutBytes},
		{"cuobj.client.callbacks", "{call}", "callback invocations", none, &st.Callbacks},
		{"cuobj.client.retries", "{call}", "callbacks retried", none, &st.Retries},
		{"cuobj.client.connections", "{connection}", "servers accepted", none, &st.Connections},
		{"cuobj.client.refused", "{connection}", "connection requests refused", none, &st.Refused},
		{"cuobj.client.strangers", "{connection}", "connection requests from an address no live token was handed to", none, &st.Strangers},
		{"cuobj.client.handshake_failures", "{connection}", "accept handshakes that did not complete", none, &st.HandshakeFailures},
		{"cuobj.client.failovers", "{failover}", "moves to a backup device", none, &st.Failovers},
		{"cuobj.client.failbacks", "{failback}", "moves back to an earlier device", none, &st.Failbacks},
	}, attrs)
}

// Handler counts every record as cuobj.events and passes it on to next
// (nil: nothing more). Use it as cuobj.Telemetry.Logger's handler, with
// the Telemetry flags selecting the messages.
type Handler struct {
	events metric.Int64Counter
	next   slog.Handler
	attrs  []attribute.KeyValue // component, from WithAttrs
}

// NewHandler returns a Handler recording into mp.
func NewHandler(mp metric.MeterProvider, next slog.Handler) (*Handler, error) {
	if mp == nil {
		return nil, errors.New("cuobjotel: nil MeterProvider")
	}
	ev, err := mp.Meter(MeterName).Int64Counter("cuobj.events", metric.WithUnit("{event}"),
		metric.WithDescription("cuObject telemetry messages"))
	if err != nil {
		return nil, err
	}
	return &Handler{events: ev, next: next}, nil
}

// Enabled is true for every level: the Telemetry flags choose messages.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return true
}

// Handle counts r and passes it on.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	kv := append(h.attrs[:len(h.attrs):len(h.attrs)],
		attribute.String("level", r.Level.String()), attribute.String("msg", r.Message))
	h.events.Add(ctx, 1, metric.WithAttributes(kv...))
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

// WithAttrs keeps the component attribute (cuobj adds it to its logger)
// for the metric and passes every attribute on.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append([]attribute.KeyValue(nil), h.attrs...)
	for _, a := range as {
		if a.Key == "component" {
			n.attrs = append(n.attrs, attribute.String("component", a.Value.String()))
		}
	}
	if h.next != nil {
		n.next = h.next.WithAttrs(as)
	}
	return &n
}

// WithGroup passes the group on.
func (h *Handler) WithGroup(name string) slog.Handler {
	n := *h
	if h.next != nil {
		n.next = h.next.WithGroup(name)
	}
	return &n
}
