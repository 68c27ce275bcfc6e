// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package interop

import (
	"os"
	"testing"

	"github.com/goroce/goroce/interop/rxelab"
)

func TestMain(m *testing.M) {
	// One guest serves every test, one at a time: TCG guests share the host's
	// cores, so parallel guests would only slow each other down.
	os.Exit(rxelab.Main(m, rxelab.Config{Guests: 1, IPv6: true}))
}
