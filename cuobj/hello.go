package cuobj

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The rdma_cm private data of the RC transport. The server's REQ carries a
// hello, the client's REP the same layout back:
//
//	0  5  "CUOBJ" (OBJ_RDMA_V1)
//	5  1  version (1)
//	6  2  protocol (1002), big endian
//	8  4  the client's endpoint number (a region token's qp field), big endian
//
// Both sides parse strictly; the client refuses a hello for another
// endpoint (a stale token) with a REJ that says nothing (see answer).
const (
	helloMagic   = "CUOBJ"
	helloVersion = 1
	helloLen     = 12
)

// errHello is matched by every hello parse error.
var errHello = errors.New("cuobj: invalid connection private data")

func appendHello(b []byte, proto Proto, endpoint uint32) []byte {
	b = append(b, helloMagic...)
	b = append(b, helloVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(proto))
	return binary.BigEndian.AppendUint32(b, endpoint)
}

// parseHello reads a hello. cm may hand over more bytes than were sent
// (the REQ's private data field is fixed-size), so trailing bytes must be
// zero.
func parseHello(b []byte) (Proto, uint32, error) {
	if len(b) < helloLen {
		return 0, 0, fmt.Errorf("%w: %d bytes", errHello, len(b))
	}
	if string(b[:5]) != helloMagic {
		return 0, 0, fmt.Errorf("%w: magic %q", errHello, b[:5])
	}
	if b[5] != helloVersion {
		return 0, 0, fmt.Errorf("%w: version %d", errHello, b[5])
	}
	for _, c := range b[helloLen:] {
		if c != 0 {
			return 0, 0, fmt.Errorf("%w: trailing data", errHello)
		}
	}
	ep := binary.BigEndian.Uint32(b[8:])
	if ep == 0 || ep > 0xFFFFFF {
		return 0, 0, fmt.Errorf("%w: endpoint %#x", errHello, ep)
	}
	return Proto(binary.BigEndian.Uint16(b[6:])), ep, nil
}
