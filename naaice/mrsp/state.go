package mrsp

import "strconv"

// State is naaice_communication_state, with the C values.
type State uint8

const (
	Init          State = 0
	Ready         State = 1 // host only: address resolved
	Connected     State = 2
	Disconnected  State = 3
	MRSPSending   State = 10
	MRSPReceiving State = 11
	MRSPDone      State = 12
	DataSending   State = 20
	Calculating   State = 21 // NAA only
	DataReceiving State = 22
	Finished      State = 30
	Failed        State = 40 // NAAICE_ERROR
)

var stateNames = map[State]string{Init: "INIT", Ready: "READY", Connected: "CONNECTED", Disconnected: "DISCONNECTED",
	MRSPSending: "MRSP_SENDING", MRSPReceiving: "MRSP_RECEIVING", MRSPDone: "MRSP_DONE", DataSending: "DATA_SENDING",
	Calculating: "CALCULATING", DataReceiving: "DATA_RECEIVING", Finished: "FINISHED", Failed: "ERROR"}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Event is what drives a Machine: CM events, local actions and work
// completions.
type Event uint8

const (
	EvAddrResolved  Event = iota + 1 // host: RDMA_CM_EVENT_ADDR_RESOLVED
	EvRouteResolved                  // host: ROUTE_RESOLVED (rdma_connect issued)
	EvConnectReq                     // NAA: CONNECT_REQUEST (MRSP receive posted, accepted)
	EvEstablished                    // ESTABLISHED
	EvWorkerStart                    // NAA: worker thread starts waiting for the AAR
	EvSendAAR                        // host: AAR posted
	EvRecvAAR                        // NAA: valid AAR received, A posted
	EvRecvBadAAR                     // NAA: AAR rejected, ERR posted
	EvSendDone                       // WC SEND of the MRSP message
	EvRecvA                          // host: valid A received
	EvRecvErr                        // ERR received (or an invalid MRSP message)
	EvStartData                      // host: input writes posted; NAA: output writes posted (Machine.StartData)
	EvWriteDone                      // WC RDMA_WRITE (incl. the final write with immediate)
	EvPostRecv                       // NAA: data receive posted for the next RPC
	EvRecvImm                        // WC RECV_RDMA_WITH_IMM with a valid immediate
	EvRecvAbort                      // NAA: WC RECV_RDMA_WITH_IMM with immediate 0 (host error)
	EvDisconnect                     // local rdma_disconnect or CM DISCONNECTED
	EvCMError                        // CM error, reject, unreachable, WC error
)

var eventNames = [...]string{"", "ADDR_RESOLVED", "ROUTE_RESOLVED", "CONNECT_REQUEST", "ESTABLISHED", "WORKER_START",
	"SEND_AAR", "RECV_AAR", "RECV_BAD_AAR", "SEND_DONE", "RECV_A", "RECV_ERR", "START_DATA", "WRITE_DONE",
	"POST_RECV", "RECV_IMM", "RECV_ABORT", "DISCONNECT", "CM_ERROR"}

func (e Event) String() string {
	if int(e) < len(eventNames) && e != 0 {
		return eventNames[e]
	}
	return "Event(" + strconv.Itoa(int(e)) + ")"
}

// Role selects the host (client) or NAA (server) machine.
type Role uint8

const (
	Host Role = iota
	NAA
)

// Transition is one row of a transition table.
type Transition struct {
	From  State
	Event Event
	To    State
}

// HostTransitions is the host machine (naaice.c). DataSending leaves for
// DataReceiving only after as many EvWriteDone as StartData announced;
// FINISHED accepts the next RPC. EvDisconnect and EvCMError are accepted in
// every state (to Disconnected and Failed).
var HostTransitions = []Transition{
	{Init, EvAddrResolved, Ready},
	{Ready, EvRouteResolved, Ready},
	{Ready, EvEstablished, Connected},
	{Connected, EvSendAAR, MRSPSending},
	{MRSPSending, EvSendDone, MRSPReceiving},
	{MRSPReceiving, EvRecvA, MRSPDone},
	{MRSPReceiving, EvRecvErr, Failed},
	{MRSPDone, EvStartData, DataSending},
	{Finished, EvStartData, DataSending},
	{DataSending, EvWriteDone, DataSending}, // until the last write, then DataReceiving
	{DataReceiving, EvRecvImm, Finished},
}

// NAATransitions is the software NAA machine (naaice_swnaa.c).
var NAATransitions = []Transition{
	{Init, EvConnectReq, Init},
	{Init, EvEstablished, Connected},
	{Connected, EvWorkerStart, MRSPReceiving},
	{MRSPReceiving, EvRecvAAR, MRSPSending},
	{MRSPReceiving, EvRecvBadAAR, Failed},
	{MRSPReceiving, EvRecvErr, Failed},
	{MRSPSending, EvSendDone, MRSPDone},
	{MRSPDone, EvPostRecv, DataReceiving},
	{DataReceiving, EvPostRecv, DataReceiving},
	{DataReceiving, EvRecvImm, Calculating},
	{DataReceiving, EvRecvAbort, Failed},
	{Calculating, EvStartData, DataSending},
	{DataSending, EvWriteDone, DataSending}, // until the last write, then DataReceiving
}

// TransitionError reports an event the current state does not accept (an
// out-of-order message or completion). It matches ErrProtocol, with reason
// "order".
type TransitionError struct {
	Role  Role
	State State
	Event Event
}

func (e *TransitionError) Error() string {
	r := "host"
	if e.Role == NAA {
		r = "NAA"
	}
	return "naaice: " + r + " got " + e.Event.String() + " in state " + e.State.String()
}

func (e *TransitionError) Unwrap() error { return errOutOfOrder }

// Machine is one side's state machine.
type Machine struct {
	role       Role
	state      State
	writesLeft int
	RPCs       int // completed RPCs (host: FINISHED reached; NAA: write-back done)
}

// NewMachine returns a machine in Init.
func NewMachine(r Role) *Machine { return &Machine{role: r} }

// State returns the current state.
func (m *Machine) State() State { return m.state }

// StartData is EvStartData for a data phase of n writes (the host's input
// regions for this RPC, or the NAA's output regions); n = 1 for a host
// abort (one zero-length write).
func (m *Machine) StartData(n int) error {
	if n <= 0 {
		return ErrNoWrites
	}
	if err := m.Step(EvStartData); err != nil {
		return err
	}
	m.writesLeft = n
	return nil
}

// Step applies ev. An event the table does not allow returns a
// *TransitionError and leaves the state unchanged; EvCMError moves to
// Failed and EvDisconnect to Disconnected (host) or Finished (NAA) from any
// state.
func (m *Machine) Step(ev Event) error {
	switch ev {
	case EvCMError:
		m.state = Failed
		return nil
	case EvDisconnect:
		if m.role == NAA {
			m.state = Finished
		} else {
			m.state = Disconnected
		}
		return nil
	}
	table := HostTransitions
	if m.role == NAA {
		table = NAATransitions
	}
	for _, t := range table {
		if t.From != m.state || t.Event != ev {
			continue
		}
		if ev == EvWriteDone {
			if m.writesLeft <= 0 {
				break
			}
			m.writesLeft--
			if m.writesLeft == 0 {
				m.state = DataReceiving
				if m.role == NAA {
					m.RPCs++
				}
			}
			return nil
		}
		if ev == EvStartData {
			m.writesLeft = 1 // Step(EvStartData) is StartData(1)
		}
		m.state = t.To
		if m.role == Host && t.To == Finished {
			m.RPCs++
		}
		return nil
	}
	return &TransitionError{Role: m.role, State: m.state, Event: ev}
}
