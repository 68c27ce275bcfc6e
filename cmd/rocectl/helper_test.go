package main

import (
	"os"
	"os/exec"
	"testing"
)

// helperEnv makes the test binary act as rocectl (TestRocectlHelper), so
// tests can run commands as separate processes that exit or are killed.
const helperEnv = "GOROCE_ROCECTL_HELPER"

// TestRocectlHelper is not a test: run as a subprocess by rocectlCmd, it
// runs rocectl with the arguments after "--" and exits with its status.
func TestRocectlHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	// "+" separates several commands run in turn by one process.
	var cmd []string
	for _, a := range append(args, "+") {
		if a != "+" {
			cmd = append(cmd, a)
			continue
		}
		if code := run(cmd, os.Stdout, os.Stderr); code != 0 {
			os.Exit(code)
		}
		cmd = nil
	}
	os.Exit(0)
}

// rocectlCmd returns a command running rocectl args in a subprocess.
func rocectlCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestRocectlHelper$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	return cmd
}
