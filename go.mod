module github.com/goroce/goroce

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/gopacket/gopacket v1.7.7
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require (
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
