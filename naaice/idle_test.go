package naaice

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

// The server's idle timeout is a net.Error timeout, as every timeout of
// goroce's is.
func TestIdleIsTimeout(t *testing.T) {
	err := fmt.Errorf("connection: %w", errIdle)
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, errIdle) {
		t.Fatalf("%v is not a net.Error timeout", err)
	}
}
