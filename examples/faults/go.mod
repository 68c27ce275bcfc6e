module example.com/goroce-faults

go 1.26.0

require github.com/goroce/goroce v0.0.0

require (
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/goroce/goroce => ../..
