// Package wirecheck proves that package ib, and the "rocectl pcap" decoder
// built on it, agree with independent RoCEv2 decoders.
//
// It generates frames for every defined opcode with ib.Build (Generate,
// WritePCAP) and its tests compare, frame by frame, what rocectl reports with
// what tshark dissects (Tshark) and with the ICRC that scapy's RoCE layer and
// an independent masked pseudo-header computation produce
// (testdata/roce_icrc.py, run by ScapyICRC). Headers Wireshark 4.0 cannot
// dissect (RD, XRC, CNP, FLUSH, ATOMIC_WRITE) are compared with a second,
// table-driven decoder written from the IBA/rxe layout tables
// (testdata/roce_layout.py, run by Layout). The same comparisons run on the
// real Soft-RoCE captures in ../shared/rxe-lab/captures next to the
// repository, when present.
//
// tshark (Debian package tshark) and scapy (python3-scapy) must be installed
// for the cross-checks; without them those tests skip and say which is
// missing.
package wirecheck
