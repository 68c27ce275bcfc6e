// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package interop qualifies goroce against real Soft-RoCE (rdma_rxe) peers:
// its tests run the rdma-core tools in qemu guests (see package rxelab and
// interop/README.md) and play the other side from the lab's peer netns with
// frames that package ib builds and parses.
//
// The package has no API of its own; it exists for its tests.
package interop
