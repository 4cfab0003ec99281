package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/idemclient"
)

// loseFirstAnswer is a network that loses the first answer it carries,
// after the server sent it.
type loseFirstAnswer struct {
	base http.RoundTripper
	lost atomic.Bool
}

func (l *loseFirstAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := l.base.RoundTrip(req)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		res.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return res, err
}

// A client calls an orders API that d1idem protects, over a network that
// loses the first answer: the Transport sends the request again with the
// same key, and gets the first answer, replayed. The order is created once.
func Example() {
	// The server: an orders endpoint behind the middleware, on a local D1.
	d1, err := d1localtest.Start(d1localtest.WithSchema())
	if err != nil {
		log.Fatal(err)
	}
	defer d1.Close()
	ledger, err := idem.New(d1.Client, idem.Config{})
	if err != nil {
		log.Fatal(err)
	}
	protect := idemhttp.Must(ledger, idemhttp.Options{
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	var orders atomic.Int64
	srv := httptest.NewServer(protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders.Add(1))
	})))
	defer srv.Close()

	// The client: the Transport makes the key and retries.
	client := &http.Client{Transport: &idemclient.Transport{
		Base: &loseFirstAnswer{base: http.DefaultTransport},
	}}
	var report idemclient.Report
	ctx := idemclient.WithReport(context.Background(), &report)
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/orders", strings.NewReader(`{"sku":"tea"}`))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("X-Account", "acct_1")
	res, err := client.Do(req)
	if err != nil {
		// An *idemclient.UnknownOutcomeError carries the key: send the
		// request again later with it as its Idempotency-Key.
		log.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	fmt.Println(res.StatusCode, string(body))
	fmt.Println("attempts:", report.Attempts, "replayed:", report.Replayed, "key sent:", res.Request.Header.Get(idemclient.HeaderKey) == report.Key)
	fmt.Println("orders created:", orders.Load())
	// Output:
	// 201 {"order":1}
	// attempts: 2 replayed: true key sent: true
	// orders created: 1
}
