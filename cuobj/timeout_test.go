package cuobj

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

func TestErrConnectTimeoutIsNetTimeout(t *testing.T) {
	err := fmt.Errorf("connect: %w", ErrConnectTimeout)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, ErrConnectTimeout) {
		t.Fatalf("%v: net.Error %v", err, ne)
	}
}
