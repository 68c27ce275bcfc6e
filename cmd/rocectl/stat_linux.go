package main

import (
	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/cmd/rocectl/devstat"
)

// steeringOn reports goroce's steering program if it runs on ifindex: its
// id and attach mode, without counters.
func steeringOn(ifindex int) (*devstat.Steering, bool) {
	info, err := bpf.Attached(ifindex)
	if err != nil || !info.Attached || info.Name != devstat.ProgramName {
		return nil, false
	}
	return &devstat.Steering{ProgramID: info.ProgramID, Mode: info.Mode.String()}, true
}

// steeringStats reads the counters of the program steeringOn found.
func steeringStats(prog *devstat.Steering) (*devstat.Steering, error) {
	st, err := devstat.ProgramStats(prog.ProgramID)
	if err != nil {
		return nil, err
	}
	s := devstat.FromStats(st)
	s.ProgramID, s.Mode = prog.ProgramID, prog.Mode
	return s, nil
}
