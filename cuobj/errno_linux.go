package cuobj

import "syscall"

// errnoECOMM is Linux's "communication error on send", one of
// RetryableErrnos.
const errnoECOMM = syscall.ECOMM
