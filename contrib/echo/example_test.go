package idemecho_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	idemecho "github.com/d1idem/d1idem/contrib/echo"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idem/idemhttp"
)

// An echo API whose order endpoint runs once per Idempotency-Key: a retry
// gets the stored answer, and the order's row is committed with it. A
// returned error is answered by echo's error handler, and stored too.
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

	e := echo.New()
	e.HideBanner = true
	e.Use(middleware.Recover()) // first: a panic then releases the key, and Recover answers 500
	e.Use(idemecho.Must(ledger, idemhttp.Options{
		// Derive the principal from authentication, never from the client.
		Principal: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	}))
	e.POST("/v1/orders", func(c echo.Context) error {
		var order struct{ SKU string }
		if err := c.Bind(&order); err != nil || order.SKU == "" {
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "sku is required")
		}
		id := "ord_" + c.Request().Header.Get(idemhttp.HeaderKey)
		// The business write commits with the stored response, once.
		if err := idemecho.MustTx(c).Add(d1client.Statement{SQL: "INSERT INTO orders (id, sku) VALUES (?, ?)", Params: []any{id, order.SKU}}); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"order": id})
	})
	api := httptest.NewServer(e)
	defer api.Close()

	for _, try := range []struct{ key, body string }{{"k1", `{"sku":"tea"}`}, {"k1", `{"sku":"tea"}`}, {"k2", `{}`}, {"k2", `{}`}} {
		req, _ := http.NewRequest("POST", api.URL+"/v1/orders", strings.NewReader(try.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set(idemhttp.HeaderKey, try.key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get(idemhttp.HeaderReplayed), strings.TrimSpace(string(body)))
	}
	rows, _ := d1.Client.Query(bg, "SELECT count(*) FROM orders")
	n, _ := rows.Rows[0][0].Int64()
	fmt.Println("orders:", n)
	// Output:
	// 201  {"order":"ord_k1"}
	// 201 true {"order":"ord_k1"}
	// 422  {"message":"sku is required"}
	// 422 true {"message":"sku is required"}
	// orders: 1
}
