package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestPerfCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "pingpong") || !strings.Contains(out.String(), "perf") {
		t.Errorf("help: exit %d, out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"help", "perf"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "--loopback") && !strings.Contains(out.String(), "-loopback") {
		t.Errorf("help perf: exit %d, out %q", code, out.String())
	}
	out.Reset()
	// The README's command: both ends in one process, no root needed.
	if code := run([]string{"perf", "write-bw", "--loopback", "-n", "50"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "BW average[MB/sec]") || !strings.Contains(out.String(), " 65536      50   ") {
		t.Errorf("perf write-bw --loopback: exit %d\nstdout %s\nstderr %s", code, out.String(), errOut.String())
	}
}
