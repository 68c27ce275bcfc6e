package mw

import (
	"fmt"
	"os"
	"testing"

	"github.com/goroce/goroce/interop/rxelab"
)

func TestMain(m *testing.M) {
	os.Exit(rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 1500,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }}))
}
