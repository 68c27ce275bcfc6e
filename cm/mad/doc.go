// Package mad implements the wire formats of InfiniBand Communication
// Management as carried over RoCEv2: the 24-byte MAD common header, every CM
// message (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP,
// APR), the rdma_cm private-data header (struct cma_hdr), rdma_cm service
// IDs, and the REJ reason codes as typed errors.
//
// Views follow gVisor's pkg/tcpip/header: a message view such as [REQ] is a
// []byte over the 232-byte CM data that follows the MAD header; its getters
// read the wire in place and Fields/Encode convert to and from a plain struct
// (REQFields). Encode writes every field, zeroes reserved bits and pads the
// private data with zeros. [ParseMAD] checks a received MAD and returns a view
// whose message accessors (MAD.REQ, MAD.REP, ...) are always full-sized; Fields
// on a hand-made short view reads missing bytes as zero instead of panicking.
//
// Bit layout follows the Linux field macros (include/rdma/ibta_vol1_c12.h):
// a field "at byte n, bit offset k, width w" occupies w bits starting k bits
// below the most significant bit of byte n. All multi-byte fields are
// big-endian.
package mad
