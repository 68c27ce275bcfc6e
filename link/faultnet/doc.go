// Package faultnet is a deterministic, allocation-free network impairment
// pipe: loss, duplication, reordering, corruption, delay with jitter and an
// optional bandwidth limit, all driven by a seeded generator and an
// injected clock.
//
// A Pipe never looks at the wall clock. The caller passes "now" (a monotonic
// offset of its own choosing) to Push and Pop, so a test can run the same
// scenario twice and observe exactly the same deliveries, and a real-time
// user (the memory link) can drive it from time.Since.
//
// Given the same Config and the same sequence of calls, a Pipe produces the
// same output, byte for byte. A zero Config is a perfect FIFO with no delay.
package faultnet
