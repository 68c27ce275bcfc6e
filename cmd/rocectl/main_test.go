package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestDispatch(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "usage") {
		t.Errorf("no args: exit %d, stderr %q", code, errOut.String())
	}
	out.Reset()
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "pcap") {
		t.Errorf("help: exit %d, out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"help", "pcap"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "--json") {
		t.Errorf("help pcap: exit %d, out %q", code, out.String())
	}
	errOut.Reset()
	if code := run([]string{"frobnicate"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "unknown command") {
		t.Errorf("unknown command: exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"pcap"}, &out, &errOut); code != 2 {
		t.Errorf("pcap without files: exit %d", code)
	}
}
