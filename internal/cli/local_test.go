package cli

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe to read while a command writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingLine = regexp.MustCompile(`d1local serving http://(\S+) `)

// serve starts `d1idem local serve args...` and returns its address once it
// listens; the server stops when the test ends. It listens on a free port
// of 127.0.0.1 unless args give another --addr (the last one counts): never
// on the default port, which a developer's own local serve may hold.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	done := make(chan int, 1)
	argv := append([]string{"d1idem", "local", "serve", "--addr", "127.0.0.1:0"}, args...)
	go func() {
		done <- run(ctx, newApp(&out, &errb, &options{}), argv, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("local serve exited %d: %s", code, errb.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := servingLine.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("local serve exited %d before listening: %s%s", code, out.String(), errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("local serve did not start: %s%s", out.String(), errb.String())
	return ""
}

func TestLocalServeNeedsATokenOffLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		r := runCLI(t, nil, "local", "serve", "--addr", addr)
		if r.code != exitUsage || !strings.Contains(r.stderr, "is not a loopback address") || !strings.Contains(r.stderr, "--token") {
			t.Errorf("--addr %s without a token: %s", addr, r)
		}
	}
	// With a token it serves, and requires it.
	addr := serve(t, "--addr", "0.0.0.0:0", "--token", "s3cret")
	port := addr[strings.LastIndexByte(addr, ':'):]
	req, _ := http.NewRequest("GET", "http://127.0.0.1"+port+"/client/v4/user/tokens/verify", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("verify without the token: %d, want 401", resp.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("verify with the token: %d, want 200", resp.StatusCode)
	}
}

func TestLocalServeBudget(t *testing.T) {
	addr := serve(t, "--budget", "10/60s")
	resp, err := http.Get("http://" + addr + "/client/v4/memberships")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Ratelimit-Policy"); got != `"burst";q=10;w=60` {
		t.Errorf("Ratelimit-Policy = %q", got)
	}
	if got := resp.Header.Get("Ratelimit"); !strings.HasPrefix(got, `"default";r=9;t=`) {
		t.Errorf("Ratelimit = %q", got)
	}
	for _, bad := range []string{"10", "x/60s", "10/0s"} {
		if r := runCLI(t, nil, "local", "serve", "--budget", bad); r.code != exitUsage || !strings.Contains(r.stderr, "--budget") {
			t.Errorf("--budget %s: %s", bad, r)
		}
	}
}

func TestLocalServeNoAutoCreateCreatesNoDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	r := runCLI(t, nil, "local", "serve", "--no-auto-create", "--dir", dir, "--addr", "127.0.0.1:0")
	if r.code == 0 || !strings.Contains(r.stderr, "missing") {
		t.Errorf("--no-auto-create with a missing --dir: %s", r)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory was created: %v", err)
	}
}
