package client

import (
	"fmt"
	"net"
	"net/url"
)

// CheckEndpoint refuses an API endpoint that a key must not be sent to: anything but https,
// except plain http to this machine (the local stack). A key sent over http to another host
// can be read by anyone on the path.
func CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return fmt.Errorf("API endpoint %q is not an absolute URL", endpoint)
	}
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && Loopback(u.Hostname()):
		return nil
	case u.Scheme == "http":
		return fmt.Errorf("API endpoint %s is plain http to another machine: the key would travel in clear; use https", endpoint)
	default:
		return fmt.Errorf("API endpoint %s: scheme %q, want https", endpoint, u.Scheme)
	}
}

// Loopback reports whether host (a URL's Hostname) is this machine: a loopback IP literal
// (127.0.0.0/8, ::1) or the name "localhost". Other names are not trusted to resolve to it.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
