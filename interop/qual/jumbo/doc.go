// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package jumbo is the qual tests at path MTU 4096: the lab runs with MTU
// 9000, so rxe's active MTU is 4096 and a RoCE frame no longer fits one
// 4096-byte UMEM chunk; the goroce device then runs AF_XDP multi-buffer.
// It has tests only, in its own binary because the lab's MTU is fixed per
// binary.
package jumbo
