// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !race

package perfrun

const raceEnabled = false
