package cuobj

import (
	"fmt"
	"testing"
)

func TestClientStatsString(t *testing.T) {
	var s ClientStats
	s.Gets.Add(2)
	s.PutBytes.Add(4096)
	want := "gets=2 puts=0 get_bytes=0 put_bytes=4096 callbacks=0 retries=0 connections=0 refused=0 strangers=0 handshake_failures=0 failovers=0 failbacks=0"
	if got := fmt.Sprintf("%v", &s); got != want {
		t.Errorf("%%v = %q, want %q", got, want)
	}
}
