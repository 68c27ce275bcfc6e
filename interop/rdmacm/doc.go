// Package rdmacm tests package cm against the Linux rdma_cm on real
// Soft-RoCE: rdma-core's rping (through package cm/rping and the rocectl
// command), udaddy (SIDR) and ucmatose, in both roles, and connection
// churn that must leave nothing behind on either side.
//
// The lab (package rxelab) runs at MTU 1500, so that rdma_cm's path MTU
// is 1024 on both sides and every frame fits an AF_XDP chunk; the lab of
// package interop runs at MTU 9000, hence a package of its own. One guest
// and one goroce device serve every test of the binary.
package rdmacm
