// Package pcapdump implements "rocectl pcap": it reads pcap and pcapng files
// and decodes every frame with package ib, printing one line per frame,
// either a human summary or a JSON object (see Record).
//
// It is a library, not part of package main, so that the wirecheck tests and
// the interop suite run exactly the code the command runs and compare its
// output with tshark's and scapy's. It is internal because Record mirrors
// the command's JSON output, whose stable contract is the command's.
package pcapdump
