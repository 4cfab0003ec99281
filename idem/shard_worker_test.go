package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/internal/d1test"
)

// Each database of a sharded ledger holds the spec's rows (and the ring
// row), so a Worker running the spec's code (conformance/spec.mjs) on one
// of them serves the principals the ring routes there, sharing their keys
// with the Go side both ways; and the ring row survives the Worker's
// claims and sweeps.
func TestSpecWorkerServesOneHome(t *testing.T) {
	w := d1test.Workerd(t)
	c := newCluster(t, w, 3)
	l := c.ledger(t, idem.Config{Heartbeat: -1})
	st, err := l.Admin().InitRing(bg)
	if err != nil {
		t.Fatal(err)
	}
	home := c.ids[1]
	var ps []string
	for i := 0; len(ps) < 3; i++ {
		if p := fmt.Sprint("acct-", i); st.Ring.Home(p) == home {
			ps = append(ps, p)
		}
	}
	goSrv := httptest.NewServer(idemhttp.Must(l, idemhttp.Options{
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Spec-Principal"), nil },
	})(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusCreated)
		io.WriteString(rw, `{"by":"go"}`)
	})))
	defer goSrv.Close()
	goURL := goSrv.URL + "/v1/orders"
	workerURL := w.HarnessURL + "/__spec/mutate/" + home + "/v1/orders"
	for _, p := range ps {
		keysSharedBothWays(t, goURL, workerURL, p)
	}
	// The principals' keys are in their home only, next to the ring row.
	for _, id := range c.ids {
		keys := c.keys(t, id)
		if id == home && len(keys) != 2*len(ps) || id != home && len(keys) != 0 {
			t.Errorf("database %s holds %v", id, keys)
		}
	}
	after, err := l.Admin().RingStatus(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range after.Homes {
		if h.Err != nil || h.Ring == nil || h.Ring.String() != st.Ring.String() {
			t.Errorf("home %s after the Worker: %+v", h.ID, h)
		}
	}
}

// keysSharedBothWays checks that the Go side (goURL) and the spec's
// Worker (workerURL) replay each other's keys for principal p.
func keysSharedBothWays(t *testing.T, goURL, workerURL, p string) {
	t.Helper()
	worker := []string{"X-Spec-Status", "201", "X-Spec-Body", `{"by":"worker"}`, "X-Spec-Set-Content-Type", "application/json"}
	if st, body, _ := postSpec(t, goURL, p, "from-go"); st != 201 || body != `{"by":"go"}` {
		t.Fatalf("%s: Go: %d %s", p, st, body)
	}
	if st, body, _ := postSpec(t, workerURL, p, "from-go", worker...); st != 201 || body != `{"by":"go"}` {
		t.Errorf("%s: the Worker does not replay the Go side's key: %d %s", p, st, body)
	}
	if st, body, _ := postSpec(t, workerURL, p, "from-worker", worker...); st != 201 || body != `{"by":"worker"}` {
		t.Fatalf("%s: Worker: %d %s", p, st, body)
	}
	if st, body, replayed := postSpec(t, goURL, p, "from-worker"); st != 201 || body != `{"by":"worker"}` || !replayed {
		t.Errorf("%s: the Go side does not replay the Worker's key: %d %s %v", p, st, body, replayed)
	}
	if st, body, _ := postSpec(t, workerURL, p, "from-go", "X-Spec-Body", "changed"); st != 201 || body != `{"by":"go"}` {
		t.Errorf("%s: second Worker replay: %d %s", p, st, body)
	}
}

// postSpec sends POST url for principal (in X-Spec-Principal) with
// Idempotency-Key key and the header pairs hdr, and returns the answer's
// status, body, and whether it was a replay.
func postSpec(t *testing.T, url, principal, key string, hdr ...string) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"a":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("X-Spec-Principal", principal)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body), res.Header.Get(idemhttp.HeaderReplayed) == "true"
}
