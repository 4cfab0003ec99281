// Package loopback tells whether a host names this machine, for the
// checks that let plain HTTP or a server without a token through only on
// loopback (d1client's bridge URLs, d1local's browser guard).
package loopback

import (
	"net"
	"strings"
)

// Host reports whether host, with or without a port and brackets, is
// localhost or a loopback IP address.
func Host(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
