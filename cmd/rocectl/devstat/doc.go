// Package devstat lets a rocectl command that runs a goroce device publish
// the device's counters, and lets "rocectl stat" read them from another
// process.
//
// A device's counters live in the process that opened it, so a reader needs
// a rendezvous. Publish listens on an abstract unix socket named
// "@goroce/stat/IFACE" (Linux abstract namespace: no file, nothing left
// behind when the process dies, even by SIGKILL, and scoped to the network
// namespace, like the interface name itself). A reader connects (Query),
// receives one JSON Snapshot and the connection closes. List finds the
// publishing devices of the caller's network namespace in
// /proc/thread-self/net/unix. Only root and the publishing user may read.
//
// A long-running command calls Start right after opening its device; it
// publishes the device for the command's lifetime (a failure to publish is
// a warning) and, with Options.Metrics, serves the device's counters and
// the protocol's (Options.Registry) to Prometheus at /metrics:
//
//	stop, err := devstat.Start(dev, devstat.Options{Command: "rping", Metrics: addr}, stderr)
//	if err != nil { ... } // the metrics address could not be listened on
//	defer stop()
//
// ProgramStats reads the counters of the steering program (package bpf)
// attached to an interface from the kernel, by program id, so it also
// works for a program kept attached by "rocectl link attach" with no
// device running.
package devstat
