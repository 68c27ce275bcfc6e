package cm

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

// ErrTimeout is a net.Error timeout, wrapped or not, and still matches
// errors.Is.
func TestErrTimeoutIsNetTimeout(t *testing.T) {
	err := fmt.Errorf("dial: %w", ErrTimeout)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, ErrTimeout) {
		t.Fatalf("%v: net.Error %v, Is %v", err, ne, errors.Is(err, ErrTimeout))
	}
}
