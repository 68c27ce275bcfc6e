package devstat

import (
	"fmt"
	"io"

	"github.com/goroce/goroce/roce"
)

// Options says how Start shows a device.
type Options struct {
	// Command names the rocectl command running the device ("perf",
	// "naaice serve"), for the reader's information.
	Command string
}

// Start makes dev's counters visible to "rocectl stat" until stop is
// called. Every long-running rocectl command calls it right after opening
// its device, from the goroutine that opened it (abstract sockets belong to
// the network namespace of the calling thread):
//
//	stop, err := devstat.Start(dev, devstat.Options{Command: "rping"}, stderr)
//	if err != nil { ... }
//	defer stop()
//
// Failing to publish (another process already publishes the interface, or
// the system is not Linux) is reported on stderr and is not an error: the
// command runs as before.
func Start(dev *roce.Device, o Options, stderr io.Writer) (stop func(), err error) {
	p, err := Publish(dev, o.Command)
	if err != nil {
		fmt.Fprintf(stderr, "rocectl %s: counters not published: %v\n", o.Command, err)
		return func() {}, nil
	}
	return func() { p.Close() }, nil
}
