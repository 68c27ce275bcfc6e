package errclosed_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/goroce/goroce/internal/errclosed"
)

func TestMatches(t *testing.T) {
	a, b := errclosed.New("a: closed"), errclosed.New("b: closed")
	wrapped := fmt.Errorf("op: %w", a)
	for _, c := range []struct {
		err, target error
		want        bool
	}{
		{a, net.ErrClosed, true},
		{a, b, true},
		{wrapped, b, true},
		{wrapped, net.ErrClosed, true},
		{net.ErrClosed, a, false},
		{errors.New("a: closed"), a, false},
		{a, errors.New("other"), false},
	} {
		if got := errors.Is(c.err, c.target); got != c.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", c.err, c.target, got, c.want)
		}
	}
	if a.Error() != "a: closed" {
		t.Errorf("message %q", a.Error())
	}
}
