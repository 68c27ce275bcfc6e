package cm

import (
	"context"
	"net/netip"
	"sync"

	"github.com/goroce/goroce/roce"
)

// ManagerOptions configure NewManager.
type ManagerOptions struct {
	// Clock drives the CM's retransmission and timewait timers (nil: the
	// monotonic clock). A test injects one to run hours of peer timeouts
	// without waiting; it must be safe for concurrent use.
	Clock Clock
	// MaxPeerCMTimeout caps the timeout exponents a peer sets for us
	// (Config.MaxPeerCMTimeout; 0: DefaultMaxPeerCMTimeout).
	MaxPeerCMTimeout uint8
	// REQRate, REQBurst and REQSources set the per-source REQ rate limit
	// (Config.REQRate; 0: the defaults, a negative REQRate: no limit).
	REQRate    float64
	REQBurst   int
	REQSources int
}

// Manager is the CM of one device: it owns the device's GSI QP (QP1) and
// one goroutine that runs the CM protocol for every listener and
// connection made through it. A device has one QP1, so it has at most one
// Manager at a time; the package-level Dial and Listen use a Manager of
// their own per device, which the first of them starts and which stops a
// few seconds after the last of their listeners and connections closed.
type Manager struct {
	a      *agent
	mu     sync.Mutex
	closed bool
}

// NewManager takes QP1 of dev and starts the CM on it. It fails if QP1 is
// taken (by another Manager, or by the package-level Dial and Listen,
// which hold it until a few seconds after their last use).
func NewManager(dev *roce.Device, opts ManagerOptions) (*Manager, error) {
	a, err := startAgent(dev, &opts)
	if err != nil {
		return nil, err
	}
	a.refs = 1 // the Manager's own, released by Close
	return &Manager{a: a}, nil
}

// Stats returns the counters of m's CM engine.
func (m *Manager) Stats() Stats {
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	s := m.a.eng.Stats()
	s.Unresolved = m.a.unresolved.Load()
	return s
}

// Device returns the device whose CM m is.
func (m *Manager) Device() *roce.Device { return m.a.dev }

// ref takes a reference on the agent for a new listener or connection.
func (m *Manager) ref() (*agent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.a.mu.Lock()
	m.a.refs++
	m.a.mu.Unlock()
	return m.a, nil
}

// Dial connects to the rdma_cm listener at raddr (see the package-level
// Dial).
func (m *Manager) Dial(ctx context.Context, raddr netip.AddrPort, opts DialOptions) (*Conn, error) {
	return dial(ctx, m.a.dev, m.ref, raddr, &opts)
}

// Listen starts accepting connection requests for addr's port (see the
// package-level Listen).
func (m *Manager) Listen(ctx context.Context, addr netip.AddrPort, opts ListenOptions) (*Listener, error) {
	return listen(ctx, m.ref, addr, opts)
}

// Close closes every listener of m and, once every connection made
// through m is closed and their disconnections have finished (bounded by
// a few seconds), releases QP1. Connections stay usable until they are
// closed. Close waits for QP1 to be released if no connection is left.
// A second Close, and Dial or Listen after Close, return ErrClosed.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.closed = true
	m.mu.Unlock()
	a := m.a
	a.mu.Lock()
	ls := make([]*Listener, 0, len(a.listeners))
	for _, l := range a.listeners {
		ls = append(ls, l)
	}
	a.mu.Unlock()
	for _, l := range ls {
		_ = l.Close()
	}
	a.release()
	a.mu.Lock()
	idle := a.refs == 0
	a.mu.Unlock()
	if idle {
		<-a.done
	}
	return nil
}

// The package-level API keeps one agent per device in a registry.
var registry struct {
	sync.Mutex
	m map[*roce.Device]*agent
	// dying are agents that left m and still hold QP1 until their
	// goroutine ends; acquire waits for them rather than fail with ErrBusy.
	dying map[*roce.Device]*agent
}

// acquire returns the running registry agent of dev, starting one (and
// taking QP1) if needed, with a reference for the caller.
func acquire(dev *roce.Device) (*agent, error) {
	registry.Lock()
	for d := registry.dying[dev]; d != nil; d = registry.dying[dev] {
		registry.Unlock()
		<-d.done
		registry.Lock()
	}
	defer registry.Unlock()
	if registry.m == nil {
		registry.m = map[*roce.Device]*agent{}
		registry.dying = map[*roce.Device]*agent{}
	}
	if a := registry.m[dev]; a != nil {
		a.mu.Lock()
		a.refs++
		a.stopping = false
		a.mu.Unlock()
		return a, nil
	}
	a, err := startAgent(dev, &ManagerOptions{})
	if err != nil {
		return nil, err
	}
	a.refs = 1
	registry.m[dev] = a
	return a, nil
}

// leaveRegistryLocked takes a out of the registry (registry lock held); until
// its goroutine ends, acquire for its device waits for it.
func (a *agent) leaveRegistryLocked() {
	if registry.m[a.dev] == a {
		delete(registry.m, a.dev)
		registry.dying[a.dev] = a
	}
}

// leftRegistry ends what leaveRegistryLocked began: QP1 is free.
func (a *agent) leftRegistry() {
	registry.Lock()
	if registry.dying[a.dev] == a {
		delete(registry.dying, a.dev)
	}
	registry.Unlock()
}
