//go:build linux

package ecnmark

// WithClsact returns opts attaching as a clsact filter even where TCX is.
func WithClsact(opts Options) Options {
	opts.clsact = true
	return opts
}
