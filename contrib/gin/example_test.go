package idemgin_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	idemgin "github.com/d1idem/d1idem/contrib/gin"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// A gin API whose order endpoint runs once per Idempotency-Key: a retry
// gets the stored answer, and the order's row is committed with it.
func Example() {
	// A local D1 with the ledger's schema; on Cloudflare, d1client.New(...).
	d1, err := d1localtest.Start(d1localtest.WithSchema())
	if err != nil {
		panic(err)
	}
	defer d1.Close()
	if _, err := d1.Client.Query(bg, "CREATE TABLE orders (id TEXT PRIMARY KEY, sku TEXT NOT NULL)"); err != nil {
		panic(err)
	}
	ledger, err := idem.New(d1.Client, idem.Config{})
	if err != nil {
		panic(err)
	}

	r := gin.New()
	r.Use(gin.Recovery()) // first: a panic then releases the key, and Recovery answers 500
	r.Use(idemgin.Must(ledger, idemhttp.Options{
		// Derive the principal from authentication, never from the client.
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	}))
	r.POST("/v1/orders", func(c *gin.Context) {
		id := "ord_" + c.GetHeader(idemhttp.HeaderKey)
		// The business write commits with the stored response, once.
		if err := idemgin.MustTx(c).Add(d1client.Statement{SQL: "INSERT INTO orders (id, sku) VALUES (?, ?)", Params: []any{id, "tea"}}); err != nil {
			c.AbortWithStatus(http.StatusInternalServerError)
			return
		}
		c.Header("Location", "/v1/orders/"+id)
		c.JSON(http.StatusCreated, gin.H{"order": id})
	})
	api := httptest.NewServer(r)
	defer api.Close()

	for range 2 { // a client retrying after a lost answer
		req, _ := http.NewRequest("POST", api.URL+"/v1/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set(idemhttp.HeaderKey, "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get(idemhttp.HeaderReplayed), string(body))
	}
	rows, _ := d1.Client.Query(bg, "SELECT count(*) FROM orders")
	n, _ := rows.Rows[0][0].Int64()
	fmt.Println("orders:", n)
	// Output:
	// 201  {"order":"ord_k1"}
	// 201 true {"order":"ord_k1"}
	// orders: 1
}
