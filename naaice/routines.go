package naaice

import "context"

// Add returns a routine that adds n to every byte of every parameter
// region (not the internal ones), as the C software NAA's example kernels
// do: custom_kernel_1 is Add(1), custom_kernel_2 is Add(2).
func Add(n byte) Routine {
	return func(_ context.Context, c *Call) uint8 {
		for _, r := range c.Regions {
			for i := range r {
				r[i] += n
			}
		}
		return 0
	}
}

// Nop is the C software NAA's empty_kernel: it changes nothing, so the
// outputs go back as the host last wrote them.
func Nop(context.Context, *Call) uint8 { return 0 }

// ExampleRoutines registers the C software NAA's example kernels
// (kernels/swnaa_kernels.c): function code 1 adds 1 to every byte, 2 adds
// 2, 3 does nothing.
func ExampleRoutines(s *Server) {
	_ = s.Handle(1, Add(1))
	_ = s.Handle(2, Add(2))
	_ = s.Handle(3, Nop)
}
