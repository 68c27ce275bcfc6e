// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InPeerNS runs fn on an OS thread that has joined the peer netns (where
// PeerIf lives), then moves the thread back. Sockets fn creates stay in the
// peer netns and may be used from any goroutine afterwards. fn must not rely
// on goroutines it starts: they run on other threads, in the original netns.
func (l *Lab) InPeerNS(fn func() error) error {
	return InNamedNS(l.PeerNS, fn)
}

// InNamedNS runs fn with the calling OS thread in the named network
// namespace (one made by "ip netns add"); see [Lab.InPeerNS].
func InNamedNS(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("rxelab: current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("rxelab: netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("rxelab: setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime retires it when this
			// goroutine exits, so no other goroutine runs in the wrong netns.
			errc <- fmt.Errorf("rxelab: returning from netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
