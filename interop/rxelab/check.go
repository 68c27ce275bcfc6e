// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
)

// ErrNotSupported is wrapped by every [MissingError].
var ErrNotSupported = errors.New("rxe lab not supported here")

// MissingError names the one capability the lab needs and this machine lacks.
type MissingError struct {
	Capability string // e.g. "root", "/dev/net/tun", "qemu-system-x86_64"
	Detail     string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("rxe lab needs %s: %s", e.Capability, e.Detail)
}

// Unwrap returns ErrNotSupported.
func (e *MissingError) Unwrap() error { return ErrNotSupported }

func missing(capability, format string, args ...any) error {
	return &MissingError{Capability: capability, Detail: fmt.Sprintf(format, args...)}
}

// qemuBinary is what the lab CLI runs (RXE_LAB_QEMU overrides it there too).
func qemuBinary() string {
	if q := os.Getenv("RXE_LAB_QEMU"); q != "" {
		return q
	}
	return "qemu-system-x86_64"
}

// Check reports the first capability the lab lacks on this machine, as a
// *MissingError, or nil. It does not need /dev/kvm: guests run under TCG.
// A missing qemu is not reported here, since [Start] installs it (the lab's
// build step installs missing host packages); see [CheckQEMU].
func Check() error {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return missing("linux/amd64", "running on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	if os.Geteuid() != 0 {
		return missing("root", "network namespaces, taps and qemu guests need euid 0 (running as uid %d)", os.Geteuid())
	}
	if f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0); err != nil {
		return missing("/dev/net/tun", "%v", err)
	} else {
		f.Close()
	}
	for _, bin := range []string{"bash", "ip", "flock", "awk", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(bin); err != nil {
			return missing(bin, "%v", err)
		}
	}
	if err := probeNetns(); err != nil {
		return missing("netns", "%v", err)
	}
	if _, err := findCLI(); err != nil {
		return missing("interop/lab/rxe-lab", "%v", err)
	}
	return nil
}

// CheckQEMU reports a *MissingError if the qemu binary is not installed.
func CheckQEMU() error {
	if _, err := exec.LookPath(qemuBinary()); err != nil {
		return missing(qemuBinary(), "%v (apt-get install qemu-system-x86)", err)
	}
	return nil
}

// probeNetns creates and deletes a named network namespace, the way the lab
// does it.
func probeNetns() error {
	name := "goroce-probe-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del: %v: %s", err, out)
	}
	return nil
}

// findCLI locates interop/lab/rxe-lab: upwards from the working directory
// (go test runs in the package directory), then beside this source file.
func findCLI() (string, error) {
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			p := filepath.Join(d, "interop", "lab", "rxe-lab")
			tried = append(tried, p)
			if isExecutable(p) {
				return p, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "lab", "rxe-lab")
		tried = append(tried, p)
		if isExecutable(p) {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("lab CLI not found (tried %v)", tried)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
