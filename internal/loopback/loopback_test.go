package loopback

import "testing"

func TestHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LocalHost:8787": true, "127.0.0.1": true, "127.1.2.3:80": true,
		"::1": true, "[::1]": true, "[::1]:8787": true,
		"": false, "evil.example": false, "evil.example:8787": false, "192.168.1.20:8787": false,
		"localhost.evil.example": false, "[::2]:1": false, "0.0.0.0": false,
	} {
		if got := Host(host); got != want {
			t.Errorf("Host(%q) = %v, want %v", host, got, want)
		}
	}
}
