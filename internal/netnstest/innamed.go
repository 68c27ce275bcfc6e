package netnstest

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNamedNS runs fn with the calling OS thread in the named network
// namespace (one made by "ip netns add" or NewNamed), then moves the
// thread back.
func InNamedNS(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime retires it when this
			// goroutine exits, so no other goroutine runs in the wrong netns.
			errc <- fmt.Errorf("netnstest: returning from netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
