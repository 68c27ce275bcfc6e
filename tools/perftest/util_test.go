// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import "net/netip"

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }
