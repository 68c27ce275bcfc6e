package mrsp

import (
	"errors"
	"testing"
)

func run(t *testing.T, m *Machine, evs ...Event) {
	t.Helper()
	for _, ev := range evs {
		if err := m.Step(ev); err != nil {
			t.Fatalf("%v: %v", ev, err)
		}
	}
}

func TestHostMachine(t *testing.T) {
	m := NewMachine(Host)
	run(t, m, EvAddrResolved, EvRouteResolved, EvEstablished, EvSendAAR, EvSendDone, EvRecvA)
	if m.State() != MRSPDone {
		t.Fatal(m.State())
	}
	for rpc := 1; rpc <= 3; rpc++ {
		if err := m.StartData(3); err != nil {
			t.Fatal(err)
		}
		run(t, m, EvWriteDone, EvWriteDone)
		if m.State() != DataSending {
			t.Fatal(m.State())
		}
		// The NAA's reply cannot be taken before the host's writes complete.
		if err := m.Step(EvRecvImm); !errors.Is(err, ErrProtocol) || ReasonOf(err) != "order" {
			t.Fatal(err)
		}
		run(t, m, EvWriteDone)
		if m.State() != DataReceiving {
			t.Fatal(m.State())
		}
		if err := m.Step(EvWriteDone); err == nil {
			t.Fatal("extra write completion accepted")
		}
		run(t, m, EvRecvImm)
		if m.State() != Finished || m.RPCs != rpc {
			t.Fatal(m.State(), m.RPCs)
		}
	}
	run(t, m, EvDisconnect)
	if m.State() != Disconnected {
		t.Fatal(m.State())
	}
}

func TestNAAMachine(t *testing.T) {
	m := NewMachine(NAA)
	run(t, m, EvConnectReq, EvEstablished, EvWorkerStart, EvRecvAAR, EvSendDone, EvPostRecv)
	for rpc := 1; rpc <= 2; rpc++ {
		run(t, m, EvRecvImm)
		if m.State() != Calculating {
			t.Fatal(m.State())
		}
		if err := m.StartData(2); err != nil {
			t.Fatal(err)
		}
		run(t, m, EvWriteDone, EvWriteDone, EvPostRecv)
		if m.State() != DataReceiving || m.RPCs != rpc {
			t.Fatal(m.State(), m.RPCs)
		}
	}
	run(t, m, EvRecvAbort)
	if m.State() != Failed {
		t.Fatal(m.State())
	}
	run(t, m, EvDisconnect)
	if m.State() != Finished {
		t.Fatal(m.State())
	}
	m = NewMachine(NAA)
	run(t, m, EvEstablished, EvWorkerStart, EvRecvBadAAR)
	if m.State() != Failed {
		t.Fatal(m.State())
	}
}

// Every (state, event) pair not in a table is refused with a typed error
// and leaves the state alone.
func TestOutOfOrder(t *testing.T) {
	states := []State{Init, Ready, Connected, Disconnected, MRSPSending, MRSPReceiving, MRSPDone, DataSending,
		Calculating, DataReceiving, Finished, Failed}
	for _, role := range []Role{Host, NAA} {
		table := HostTransitions
		if role == NAA {
			table = NAATransitions
		}
		for _, s := range states {
			for ev := EvAddrResolved; ev < EvDisconnect; ev++ {
				allowed := false
				for _, tr := range table {
					allowed = allowed || (tr.From == s && tr.Event == ev)
				}
				m := &Machine{role: role, state: s, writesLeft: 1}
				err := m.Step(ev)
				if allowed != (err == nil) {
					t.Errorf("role %d %v %v: %v", role, s, ev, err)
				}
				var te *TransitionError
				if err != nil && (!errors.As(err, &te) || te.State != s || m.State() != s || te.Error() == "") {
					t.Errorf("bad error %v", err)
				}
			}
		}
	}
	// Typical C-side ordering faults.
	m := NewMachine(Host)
	run(t, m, EvAddrResolved, EvEstablished, EvSendAAR)
	if err := m.Step(EvRecvA); err == nil { // A before the AAR's send completion
		t.Fatal("A accepted in MRSP_SENDING")
	}
	if err := m.StartData(0); err != ErrNoWrites {
		t.Fatal(err)
	}
	if State(99).String() != "State(99)" || Event(99).String() != "Event(99)" || Failed.String() != "ERROR" {
		t.Fatal("names")
	}
}
