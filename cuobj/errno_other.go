//go:build !linux

package cuobj

import "syscall"

// errnoECOMM stands in for Linux's ECOMM, which other systems lack: ENOLINK,
// already one of RetryableErrnos, so the list only repeats an entry.
const errnoECOMM = syscall.ENOLINK
