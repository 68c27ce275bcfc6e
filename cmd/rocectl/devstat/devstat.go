package devstat

import (
	"errors"
	"time"
)

// SocketPrefix begins the abstract socket name of every publishing device;
// the interface name follows.
const SocketPrefix = "@goroce/stat/"

// Names of the steering program and its counter map, as package bpf loads
// them (the kernel keeps 15 characters of an object name).
const (
	ProgramName  = "goroce_steer"
	StatsMapName = "goroce_stats"
)

var (
	// ErrNoDevice is returned by Query when no process publishes a device
	// on the interface in the caller's network namespace.
	ErrNoDevice = errors.New("devstat: no running goroce device publishes this interface")
	// ErrPublished is returned by Publish when another live process
	// already publishes the interface.
	ErrPublished = errors.New("devstat: interface already published by another device")
	// ErrNotSteering is returned by ProgramStats for a program that is not
	// goroce's steering program.
	ErrNotSteering = errors.New("devstat: not the goroce steering program")
	// ErrNotSupported is returned off Linux, where there are no abstract
	// unix sockets to publish on and no steering program to read.
	ErrNotSupported = errors.New("devstat: publishing and reading device counters needs Linux")
)

// Snapshot is what a publishing device reports: its identity and counters
// at Time.
type Snapshot struct {
	Interface string            `json:"interface"`
	PID       int               `json:"pid"`
	Command   string            `json:"command,omitempty"`
	Link      string            `json:"link"`               // afxdp, udp or mem
	Fallback  string            `json:"fallback,omitempty"` // why AF_XDP was not used
	Started   time.Time         `json:"started"`
	Time      time.Time         `json:"time"`
	Counters  map[string]uint64 `json:"counters"` // roce.CounterNames → value
	// Steering is the device's own view of its steering program (AF_XDP
	// link only).
	Steering *Steering `json:"steering,omitempty"`
}

// Steering are the decision counters of the XDP steering program
// (bpf.Stats).
type Steering struct {
	ProgramID  uint32 `json:"program_id,omitempty"`
	Mode       string `json:"mode,omitempty"`
	Redirected uint64 `json:"redirected"`
	NoSocket   uint64 `json:"no_socket"`
	Passed     uint64 `json:"passed"`
	OtherAddr  uint64 `json:"other_addr"`
}
