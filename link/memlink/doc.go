// Package memlink is an in-memory link.Link pair: what one end writes the
// other reads, through a faultnet pipe per direction, so tests and
// simulations get deterministic loss, duplication, reordering, corruption
// and delay from a seed.
//
// By default the pair runs in real time: a reader sleeps until the next
// frame is due (a pipe's Delay is honoured with a timer). With a
// ManualClock the pair is stepped instead: nothing becomes due until the
// test advances the clock, which makes whole runs reproducible.
//
// Frames are handed to ReadBatch straight from the pipe's buffers (no
// copy); they are valid only during the callback.
package memlink
