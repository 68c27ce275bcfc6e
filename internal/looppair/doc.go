// Package looppair opens a server's and a client's goroce device on kernel
// UDP sockets on loopback, for tests over the UDP link (cuObject's attack suites).
package looppair
