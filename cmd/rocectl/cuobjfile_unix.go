//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// fileTarget is where a GET lands: a temporary file beside the target,
// mapped into memory, so that the server's RDMA WRITEs go straight into
// the file's pages (no buffer of the object's size in the heap, no copy
// and write after the transfer). commit renames it over the target once
// the object is in, so a GET that fails leaves the target as it was.
type fileTarget struct {
	name, tmp string
	f         *os.File
	buf       []byte // the mapping; nil once unmapped
}

// mapTarget makes the target of a GET of size bytes into name. It fails
// for a name that is not a regular file (a device, say) or that the file
// system cannot map; the caller then writes a buffer.
func mapTarget(name string, size int64) (*fileTarget, error) {
	if st, err := os.Stat(name); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	if size <= 0 || size > int64(^uint(0)>>1) {
		return nil, fmt.Errorf("%d bytes", size)
	}
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".part-*")
	if err != nil {
		return nil, err
	}
	t := &fileTarget{name: name, tmp: f.Name(), f: f}
	if err := f.Truncate(size); err != nil {
		t.abort()
		return nil, err
	}
	if t.buf, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		t.abort()
		return nil, err
	}
	return t, nil
}

// commit keeps the first n bytes and puts the file in the target's place,
// with the target's permissions if it existed (else 0644 less the
// umask). The mapping must no longer be registered.
func (t *fileTarget) commit(n int64) error {
	size := int64(len(t.buf))
	err := syscall.Munmap(t.buf)
	t.buf = nil
	if err == nil && n < size {
		err = t.f.Truncate(n)
	}
	if err == nil {
		mode := os.FileMode(0o644)
		if st, serr := os.Stat(t.name); serr == nil {
			mode = st.Mode().Perm()
		} else {
			um := syscall.Umask(0)
			syscall.Umask(um)
			mode &^= os.FileMode(um)
		}
		err = t.f.Chmod(mode)
	}
	if err == nil {
		err = t.f.Close()
		t.f = nil
	}
	if err == nil {
		err = os.Rename(t.tmp, t.name)
	}
	if err != nil {
		t.abort()
	}
	return err
}

// abort unmaps and removes the temporary file. The mapping must no longer
// be registered.
func (t *fileTarget) abort() {
	if t.buf != nil {
		_ = syscall.Munmap(t.buf)
		t.buf = nil
	}
	if t.f != nil {
		_ = t.f.Close()
		t.f = nil
	}
	_ = os.Remove(t.tmp)
}
