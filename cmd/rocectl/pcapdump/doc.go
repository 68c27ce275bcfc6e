// Package pcapdump implements "rocectl pcap": it reads pcap and pcapng files
// and decodes every frame with package ib, printing one line per frame,
// either a human summary or a JSON object (see Record).
//
// It is a separate package, not part of package main, so that the wirecheck
// tests can run exactly the code the command runs and compare its output with
// tshark's and scapy's.
package pcapdump
