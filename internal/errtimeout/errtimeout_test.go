package errtimeout_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/goroce/goroce/internal/errtimeout"
)

func TestTimeout(t *testing.T) {
	a, b := errtimeout.New("a: timed out"), errtimeout.New("b: timed out")
	wrapped := fmt.Errorf("op: %w", a)
	var ne net.Error
	if !errors.As(wrapped, &ne) || !ne.Timeout() {
		t.Fatalf("%v is not a net.Error timeout", wrapped)
	}
	if !errors.Is(wrapped, a) || errors.Is(wrapped, b) || errors.Is(a, b) {
		t.Fatal("a sentinel matches only itself")
	}
	if a.Error() != "a: timed out" {
		t.Fatalf("message %q", a.Error())
	}
}
