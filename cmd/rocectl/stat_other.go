//go:build !linux

package main

import (
	"errors"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
)

// steeringOn: the XDP steering program is Linux's.
func steeringOn(int) (*devstat.Steering, bool) { return nil, false }

func steeringStats(*devstat.Steering) (*devstat.Steering, error) {
	return nil, errors.ErrUnsupported
}
