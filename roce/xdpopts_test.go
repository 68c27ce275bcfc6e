package roce

import "github.com/goroce/goroce/roce/link/xdplink"

func xdpOptionsQueue(q int) xdplink.Options { return xdplink.Options{Queue: q} }
