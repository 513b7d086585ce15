//go:build !unix

package upstream

import "net"

// alive cannot peek on this platform: an idle connection the peer closed fails its next call,
// which the retry policy then retries.
func alive(net.Conn) bool { return true }
