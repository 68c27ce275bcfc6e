package main

import "github.com/goroce/goroce/internal/pcapdump"

func init() {
	register("pcap", command{
		summary: "decode every frame of pcap/pcapng files as RoCEv2",
		run:     pcapdump.Run,
	})
}
