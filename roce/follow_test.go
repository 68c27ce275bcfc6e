//go:build linux

package roce_test

import (
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// The netns tests run devices that follow their interface; following is
// package netdev's (roce.Host over rtnetlink).
func init() { roce.OpenFollowing = netdev.OpenLink }
