package conformance

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// specPath is where both sides serve the mutation. The fingerprint covers
// the path, so the Go server serves the harness's path too.
const specPath = "/__spec/ledger/v1/orders?src=interop"

// interopAnswer is one HTTP answer.
type interopAnswer struct {
	Status   int
	Body     string
	CT, Loc  string
	Replayed bool
}

func interopPost(t *testing.T, url, principal, key, body string, header map[string]string) interopAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+specPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("X-Spec-Principal", principal)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return interopAnswer{res.StatusCode, string(data), res.Header.Get("Content-Type"), res.Header.Get("Location"), res.Header.Get(idemhttp.HeaderReplayed) == "true"}
}

// TestSpecWorkerSharesLedgerThroughBridge: a Worker running the spec's
// handleIdempotentMutation on its D1 binding, and a Go backend (the idem
// middleware) whose D1 client talks to the bridge, share one ledger table
// in one database. A request first executed by either is replayed by the
// other, byte for byte in status, Content-Type, Location and body, without
// executing again; a key reused with another body is refused by both. The
// Go side runs on an injected clock (the spec's Worker binds Date.now()).
func TestSpecWorkerSharesLedgerThroughBridge(t *testing.T) {
	b := d1test.Workerd(t)
	db := b.NewDatabase(t)
	c := db.Client(t)
	d1test.ApplySchema(t, c)
	l, err := idem.New(c, idem.Config{Clock: time.Now, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	var goRuns atomic.Int64
	mw, err := idemhttp.New(l, idemhttp.Options{Principal: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Spec-Principal"), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	goSrv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		goRuns.Add(1)
		body, _ := io.ReadAll(r.Body)
		out, _ := json.Marshal(map[string]string{"by": "go", "request": string(body)})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/orders/from-go")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})))
	defer goSrv.Close()
	worker := map[string]string{"X-Spec-Database": db.ID, "X-Spec-Location": "/v1/orders/from-worker"}
	same := func(t *testing.T, what string, a, first interopAnswer) {
		t.Helper()
		if a.Status != first.Status || a.Body != first.Body || a.CT != first.CT || a.Loc != first.Loc {
			t.Errorf("%s: %+v, want the first answer %+v", what, a, first)
		}
	}

	t.Run("first on the Worker, replayed by Go", func(t *testing.T) {
		first := interopPost(t, b.HarnessURL, "acct", "w-1", `{"sku":"a"}`, worker)
		if first.Status != 201 || !strings.Contains(first.Body, `"by":"spec-worker"`) {
			t.Fatalf("the Worker's first execution: %+v", first)
		}
		runs := goRuns.Load()
		again := interopPost(t, goSrv.URL, "acct", "w-1", `{"sku":"a"}`, nil)
		same(t, "Go's replay", again, first)
		if !again.Replayed || goRuns.Load() != runs {
			t.Errorf("Go executed the Worker's request again (replayed=%v)", again.Replayed)
		}
		reused := interopPost(t, goSrv.URL, "acct", "w-1", `{"sku":"b"}`, nil)
		if reused.Status != http.StatusConflict || !strings.Contains(reused.Body, idemhttp.CodeKeyReused) {
			t.Errorf("Go on a reused key: %+v", reused)
		}
	})

	t.Run("first on Go, replayed by the Worker", func(t *testing.T) {
		first := interopPost(t, goSrv.URL, "acct", "g-1", `{"sku":"c"}`, nil)
		if first.Status != 201 || first.Replayed || !strings.Contains(first.Body, `"by":"go"`) {
			t.Fatalf("Go's first execution: %+v", first)
		}
		again := interopPost(t, b.HarnessURL, "acct", "g-1", `{"sku":"c"}`, worker)
		same(t, "the Worker's replay", again, first)
		reused := interopPost(t, b.HarnessURL, "acct", "g-1", `{"sku":"d"}`, worker)
		if reused.Status != http.StatusConflict || !strings.Contains(reused.Body, "idempotency_key_reused") {
			t.Errorf("the Worker on a reused key: %+v", reused)
		}
		// The same key under another principal is another row, on both.
		other := interopPost(t, b.HarnessURL, "acct-2", "g-1", `{"sku":"c"}`, worker)
		if other.Status != 201 || !strings.Contains(other.Body, `"by":"spec-worker"`) {
			t.Errorf("another principal's key: %+v", other)
		}
	})
}
