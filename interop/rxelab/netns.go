// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import "github.com/goroce/goroce/internal/netnstest"

// InPeerNS runs fn on an OS thread that has joined the peer netns (where
// PeerIf lives), then moves the thread back. Sockets fn creates stay in the
// peer netns and may be used from any goroutine afterwards. fn must not rely
// on goroutines it starts: they run on other threads, in the original netns.
func (l *Lab) InPeerNS(fn func() error) error {
	return InNamedNS(l.PeerNS, fn)
}

// InNamedNS runs fn with the calling OS thread in the named network
// namespace (one made by "ip netns add"); see [Lab.InPeerNS].
func InNamedNS(name string, fn func() error) error { return netnstest.InNamedNS(name, fn) }
