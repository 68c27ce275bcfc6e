package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// badInputs are command lines that must fail cleanly: a usage error (exit
// 2) unless noted, quickly, without a panic or a runtime stack dump. Each
// used to crash, hang or be taken silently (issue #32).
var badInputs = []struct {
	args string
	exit int
}{
	{"", 2},
	{"frobnicate", 2},
	{"help frobnicate", 2},
	{"--frobnicate", 2},

	{"perf", 2},
	{"perf no-such-test", 2},
	{"perf write-bw --loopback -s 99999999999", 2},
	{"perf write-bw --loopback -s 4294967296", 2},
	{"perf write-bw --loopback -s -1", 2},
	{"perf write-bw --loopback -s 12k", 2},
	{"perf write-bw --loopback -s 99999999999999999999999", 2},
	{"perf write-bw --loopback -t -1", 2},
	{"perf write-bw --loopback -Q -1", 2},
	{"perf send-bw --loopback -r -1", 2},
	{"perf write-bw --loopback -t 99999", 2},
	{"perf write-bw --loopback -n -5", 2},
	{"perf write-bw --loopback -n 99999999999", 2},
	{"perf write-bw --loopback -x 999", 2},
	{"perf write-bw --loopback -m 1000", 2},
	{"perf write-bw --loopback -p 7000", 2},
	{"perf write-bw --loopback --timeout -1s", 2},
	{"perf write-bw --loopback --timeout soon", 2},
	{"perf write-bw --loopback -A NAND", 2},
	{"perf write-bw --loopback --connection UC", 2},
	{"perf write-bw --loopback --frobnicate", 2},
	{"perf write-bw -p 99999 192.0.2.1", 2},
	{"perf write-bw -p 0", 2},
	{"perf write-bw 192.0.2.1 192.0.2.2", 2},
	{"perf write-bw 192.0.2.1 -s -1", 2},
	{"perf write-bw --loopback -q 0", 2},
	{"perf write-bw --loopback --shards 65", 2},
	{"perf write-bw --loopback --shards -1", 2},
	{"perf write-bw --loopback --queues 65", 2},
	{"perf write-bw --loopback --queues -1", 2},
	{"perf write-bw --loopback -q 1025", 2},
	{"perf write-bw --loopback --qp=-3", 2},
	{"perf write-bw --loopback -q 1024 -s 8388608", 2},
	{"perf write-bw --loopback -q 1024 -a", 2},
	{"perf write-bw --loopback -q 600 -s 4000000", 2},
	{"perf write-lat --loopback -q 2", 2},
	{"perf write-bw --loopback -D 0", 2},
	{"perf write-bw --loopback --duration=-1", 2},
	{"perf write-bw --loopback -D 99999999999", 2},
	{"perf write-bw --loopback -D 1 -e", 2},
	{"perf send-bw --loopback --run_infinitely", 2},
	{"perf write-lat --loopback --run_infinitely", 2},
	{"perf send-bw --loopback -b", 2},
	{"perf write-lat --loopback -b", 2},
	{"perf write-lat --loopback -N", 2},
	{"perf write-bw --loopback -I -1", 2},
	{"perf write-bw --loopback -I 401", 2},
	{"perf read-bw --loopback -I 64", 2},
	{"perf write-bw --loopback -l 0", 2},
	{"perf write-bw --loopback -l 99999", 2},
	{"perf write-bw --loopback -l 7 -n 1000", 2},
	{"perf write-bw --loopback -l 8 -Q 3", 2},
	{"perf write-bw --loopback -u 32", 2},
	{"perf write-bw --loopback --qp-timeout=-1", 2},
	{"perf write-bw --loopback -T 256", 2},
	{"perf write-bw --loopback --tos=-1", 2},
	{"perf write-bw --loopback --size=-1", 2},
	{"perf write-bw --loopback --iters=99999999999", 2},
	{"perf write-bw --loopback --gid-index=256", 2},
	{"perf write-bw --loopback --tx-depth=99999", 2},
	{"perf write-bw --port=0 192.0.2.1", 2},
	{"perf write-bw --loopback --metrics 127.0.0.1", 2},
	{"perf write-bw --loopback --metrics :99999", 2},

	{"pingpong", 2},
	{"pingpong uc", 2},
	{"pingpong rc -d lo -s -1 192.0.2.1", 2},
	{"pingpong rc -d lo -s 99999999999 192.0.2.1", 2},
	{"pingpong ud -d lo -n 0", 2},
	{"pingpong rc -d lo -r -1", 2},
	{"pingpong rc -d lo -p 70000", 2},
	{"pingpong rc -d lo --metrics nohostport", 2},
	{"pingpong rc -d lo -m 3", 2},
	{"pingpong rc -d lo -g 256", 2},
	{"pingpong rc -d lo 192.0.2.1 192.0.2.2", 2},

	{"rstream -S -1", 2},
	{"perf write-bw -J notanip", 2},
	{"perf write-bw --bind_source_ip=::", 2},
	{"perf write-bw -J 224.0.0.1", 2},
	{"rstream -C -1", 2},
	{"rstream -I -2", 2},
	{"rstream -S 99999999999", 2},
	{"rstream -S lots", 2},
	{"rstream -p 99999", 2},
	{"rstream -B -1", 2},
	{"rstream -k -1", 2},
	{"rstream -T zz", 2},
	{"rstream -f gid", 2},
	{"rstream extra", 2},
	{"riostream -S -1", 2},
	{"riostream -C 0", 2},
	{"riostream -T s", 2},
	{"rcopy -p 0", 2},
	{"rcopy onlysource", 2},

	{"rping", 2},
	{"rping -s -c", 2},
	{"rping -c", 2},
	{"rping -s -S 5", 2},
	{"rping -s -S 99999999999", 2},
	{"rping -c -a 192.0.2.1 -C -1", 2},
	{"rping -s -p 0", 2},
	{"rping -s -p many", 2},

	{"naaice", 2},
	{"naaice frob", 2},
	{"naaice serve", 2},
	{"naaice serve -d lo -p 0", 2},
	{"naaice serve -d lo -conns 0", 2},
	{"naaice call", 2},
	{"naaice call 192.0.2.1 1", 2},
	{"naaice call -f 200 192.0.2.1 1 10", 2},
	{"naaice call -n 0 192.0.2.1 1 10", 2},
	{"naaice call -t 0 192.0.2.1 1 10", 2},
	{"naaice call -pause -1s 192.0.2.1 1 10", 2},
	{"naaice call 192.0.2.1 1 99999999999", 2},
	{"naaice call 192.0.2.1 -1 10", 2},

	{"fpga", 2},
	{"fpga both", 2},
	{"fpga send -d lo -size 5000", 2},
	{"fpga send -d lo -size -1", 2},
	{"fpga send -d lo -rate -1", 2},
	{"fpga send -d lo -retry 9", 2},
	{"fpga send -d lo -channel 256", 2},
	{"fpga send -d lo -pmtu 1000", 2},
	{"fpga send -d lo -peer-qpn 99999999", 2},
	{"fpga send -d lo -peer-mr-rkey 99999999999", 2},
	{"fpga recv -d lo -depth 0", 2},
	{"fpga recv -d lo -depth 99999", 2},
	{"fpga recv -d lo -rnr-timer 40", 2},
	{"fpga recv -d lo -max-payload 99999999999", 2},
	{"fpga recv -d lo -timeout -1s", 2},
	{"fpga recv -d lo -hold -1ms", 2},
	{"fpga recv -d lo -count -1", 2},

	{"capture -d lo -w - -c -1", 2},
	{"capture -d lo -w - -s 0", 2},
	{"capture -d lo -w - -port 0", 2},
	{"capture -d lo -w - -duration -1s", 2},
	{"capture -w -", 2},

	{"cuobj", 2},
	{"cuobj list", 2},
	{"cuobj serve -udp-port 0 dir", 2},
	{"cuobj get -udp-port -1 http://192.0.2.1:9000/b/k f", 2},
	{"cuobj serve -path-mtu 5 dir", 2},
	{"cuobj put -frob http://192.0.2.1:9000/b/k f", 2},
	{"cuobj put -timeout -1s http://192.0.2.1:9000/b/k f", 2},
	{"cuobj get -timeout soon http://192.0.2.1:9000/b/k f", 2},

	{"link attach -d lo -port 0", 2},
	{"link attach -d lo -duration -1s", 2},
	{"link frob", 2},
	{"link show extra", 2},
	{"stat --frob", 2},
	{"stat extra", 2},
	{"dev --frob", 2},
	{"pcap", 2},
	{"pcap --frob", 2},
	{"pcap /nonexistent.pcap --json", 1},
	{"fpga recv -d lo -max-payload 1000000 -depth 16000", 2},
	{"perf write-bw --loopback -n 200000000", 2},
	{"naaice call 192.0.2.1 5 1073741824_1073741824_1073741824_1073741824_1073741824", 2},
}

// TestBadInput runs the built binary on each bad input: a crash or a hang
// would not show in an in-process call.
func TestBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rocectl")
	}
	bin := filepath.Join(t.TempDir(), "rocectl")
	if out, err := exec.Command(goTool(t), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range badInputs {
		t.Run(tc.args, func(t *testing.T) {
			t.Parallel()
			// Generous: the machine may be busy; a hang takes far longer.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, splitArgs(tc.args)...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("still running after 20 s\n%s", out.String())
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.exit {
				t.Errorf("exit %d, want %d\n%s", code, tc.exit, out.String())
			}
			for _, bad := range []string{"panic:", "goroutine ", "fatal error"} {
				if strings.Contains(out.String(), bad) {
					t.Errorf("output has %q:\n%s", bad, out.String())
				}
			}
		})
	}
}

// splitArgs splits a bad input at spaces; '_' stands for a space inside
// one argument.
func splitArgs(s string) []string {
	args := strings.Fields(s)
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "_", " ")
	}
	return args
}

// goTool returns the go command, or skips the test.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skip("the go tool is not available")
	}
	return p
}
