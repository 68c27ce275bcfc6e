// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Exec runs args in the guest (no shell: each argument is passed verbatim)
// and returns the command's stdout, stderr and exit code. err is non-nil
// only when the lab failed (guest gone, job spool broken) or ctx ended; then
// the guest job has been killed. A ctx deadline is also handed to the guest,
// which kills the job's whole process group when it passes.
//
// A lab fault of the guest (see [ErrLabFault]) ends the command at once:
// err then wraps the [FaultError].
func (g *Guest) Exec(ctx context.Context, args ...string) (stdout, stderr []byte, code int, err error) {
	if ferr := g.Fault(); ferr != nil {
		return nil, nil, -1, fmt.Errorf("rxelab: exec %q on %s: %w", args, g.Name, ferr)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	faulted := g.Faulted()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-faulted:
			cancel(g.Fault())
		case <-stop:
		}
	}()
	stdout, stderr, code, err = g.execUnwatched(ctx, args...)
	if ferr := context.Cause(ctx); err != nil && ferr != nil && errors.Is(ferr, ErrLabFault) {
		err = fmt.Errorf("rxelab: exec %q on %s: %w", args, g.Name, ferr)
	}
	return stdout, stderr, code, err
}

// execUnwatched is Exec without the fault watch (for diagnostics).
func (g *Guest) execUnwatched(ctx context.Context, args ...string) (stdout, stderr []byte, code int, err error) {
	if len(args) == 0 {
		return nil, nil, -1, fmt.Errorf("rxelab: Exec without a command")
	}
	cli := []string{"exec", g.Name}
	if dl, ok := ctx.Deadline(); ok {
		secs := math.Ceil(time.Until(dl).Seconds())
		if secs < 1 {
			secs = 1
		}
		cli = append(cli, "--timeout", strconv.Itoa(int(secs)))
	}
	cli = append(cli, "--")
	cli = append(cli, args...)
	stdout, stderr, code, err = g.lab.run(ctx, cli...)
	if err != nil {
		return stdout, stderr, code, fmt.Errorf("rxelab: exec %q on %s: %w", args, g.Name, err)
	}
	// The CLI's own failures (exit 124 on its timeout, 255 otherwise) end
	// with an "rxe-lab: " line; the guest command's output never has one.
	if (code == 124 || code == 255) && bytes.Contains(append([]byte{'\n'}, stderr...), []byte("\nrxe-lab: ")) {
		if code == 124 && ctx.Err() != nil {
			return stdout, stderr, code, fmt.Errorf("rxelab: exec %q on %s: %w", args, g.Name, ctx.Err())
		}
		return stdout, stderr, code, fmt.Errorf("rxelab: exec %q on %s failed: %s", args, g.Name, bytes.TrimSpace(stderr))
	}
	return stdout, stderr, code, nil
}

// Exec runs args in the guest called name; see [Guest.Exec].
func (l *Lab) Exec(ctx context.Context, name string, args ...string) (stdout, stderr []byte, code int, err error) {
	g := l.Guest(name)
	if g == nil {
		return nil, nil, -1, fmt.Errorf("rxelab: no guest %q", name)
	}
	return g.Exec(ctx, args...)
}

// Guest returns the guest called name, or nil.
func (l *Lab) Guest(name string) *Guest {
	for _, g := range l.Guests {
		if g.Name == name {
			return g
		}
	}
	return nil
}

// Job is a command running in a guest in the background (a server).
type Job struct {
	done           chan struct{}
	stdout, stderr []byte
	code           int
	err            error
}

// Start runs args in the guest in the background; [Job.Wait] returns what
// [Guest.Exec] would. Cancelling ctx kills the guest job.
func (g *Guest) Start(ctx context.Context, args ...string) *Job {
	j := &Job{done: make(chan struct{})}
	go func() {
		defer close(j.done)
		j.stdout, j.stderr, j.code, j.err = g.Exec(ctx, args...)
	}()
	return j
}

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for the job to end.
func (j *Job) Wait() (stdout, stderr []byte, code int, err error) {
	<-j.done
	return j.stdout, j.stderr, j.code, j.err
}

// Share returns the host path of the guest's private share folder for
// files: what is put there appears in the guest under /mnt/lab/files.
func (g *Guest) Share(ctx context.Context) (string, error) {
	out, _, code, err := g.lab.run(ctx, "share", g.Name)
	if err != nil || code != 0 {
		return "", fmt.Errorf("rxelab: share of %s: exit %d, %v", g.Name, code, err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "files"), nil
}
