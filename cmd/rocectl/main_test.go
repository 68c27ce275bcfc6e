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

func TestVersionAndHelpFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--version"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "rocectl ") {
		t.Errorf("--version: exit %d, out %q", code, out.String())
	}
	// Every command's help lists its flags, each with a placeholder that
	// says what it takes rather than its Go type.
	for name := range commands {
		out.Reset()
		if code := run([]string{"help", name}, &out, &errOut); code != 0 {
			t.Errorf("help %s: exit %d", name, code)
		}
		if name == "fpga" || name == "naaice" {
			// A summary of two modes; each mode's help lists its flags.
			out.Reset()
			mode := map[string]string{"fpga": "send", "naaice": "call"}[name]
			run([]string{name, mode, "-h"}, &out, &out)
		}
		if !strings.Contains(out.String(), "\n  -") {
			t.Errorf("help %s lists no flags:\n%s", name, out.String())
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(line, "  -") &&
				(f[1] == "int" || f[1] == "uint" || f[1] == "string" || f[1] == "uint64" || f[1] == "float") {
				t.Errorf("help %s: %q has no meaningful placeholder", name, line)
			}
		}
	}
}
