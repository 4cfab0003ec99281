package d1client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/d1idem/d1idem/d1client/budget"
)

// Database is one of an account's D1 databases, as Cloudflare's database
// list gives it. On a d1local server a database's UUID is its name.
type Database struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// String is the database for people: "name (uuid)", or its name where that
// is its UUID (on d1local).
func (d Database) String() string {
	if d.UUID == d.Name || d.UUID == "" {
		return d.Name
	}
	return d.Name + " (" + d.UUID + ")"
}

// ListDatabases lists at most limit of the account's D1 databases, in the
// order the API gives them (GET accounts/{account}/d1/database, page by
// page), with the client's base URL, token and HTTP client: on Cloudflare,
// or on a d1local server. Each call spends one call of the API budget.
// Through a bridge, which serves only the databases it binds, it fails.
func (c *Client) ListDatabases(ctx context.Context, limit int) ([]Database, error) {
	if c.bridge {
		return nil, errors.New("a bridge serves the databases its wrangler.toml binds, and lists none")
	}
	out := []Database{}
	for page := 1; len(out) < limit; page++ {
		dbs, more, err := c.listPage(ctx, page)
		if err != nil {
			return nil, err
		}
		out = append(out, dbs...)
		if !more || len(dbs) == 0 {
			break
		}
	}
	return out[:min(len(out), limit)], nil
}

// listPage fetches one page of the database list and reports whether more
// pages follow.
func (c *Client) listPage(ctx context.Context, page int) ([]Database, bool, error) {
	const perPage = 100
	u := fmt.Sprintf("%s?per_page=%d&page=%d", c.databasesURL(), perPage, page)
	res, body, err := c.apiCall(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, false, fmt.Errorf("listing the databases: %w", err)
	}
	var env struct {
		Success    bool       `json:"success"`
		Result     []Database `json:"result"`
		ResultInfo struct {
			TotalCount int `json:"total_count"`
		} `json:"result_info"`
	}
	if err := json.Unmarshal(body, &env); err != nil || !env.Success {
		return nil, false, fmt.Errorf("listing the databases: HTTP %d", res.StatusCode)
	}
	return env.Result, len(env.Result) == perPage && page*perPage < env.ResultInfo.TotalCount, nil
}

// localServer is the Server header of a d1local server's answers
// (d1local.ServerName).
const localServer = "d1local"

// codeDatabaseExists is D1's error code for creating a database whose name
// is taken.
const codeDatabaseExists = 7502

// CreateLocalDatabase creates the client's database (Config.DatabaseID) on
// a d1local server, where a database's ID is its name, through the create
// endpoint `wrangler d1 create` uses, and reports whether it did. It
// creates nothing and reports false when the database exists, through a
// bridge, and when the server is not d1local (its answers do not carry
// d1local's Server header) or does not answer: on D1 a database gets its
// UUID from the create call, so none can be made under an ID chosen
// beforehand (wrangler or the dashboard creates it).
func (c *Client) CreateLocalDatabase(ctx context.Context) (bool, error) {
	id := c.cfg.DatabaseID
	if c.bridge {
		return false, nil
	}
	res, _, err := c.apiCall(ctx, http.MethodGet, c.databasesURL()+"/"+url.PathEscape(id), nil)
	if err != nil || res.StatusCode != http.StatusNotFound || res.Header.Get("Server") != localServer {
		return false, nil
	}
	body, _ := json.Marshal(map[string]string{"name": id})
	res, data, err := c.apiCall(ctx, http.MethodPost, c.databasesURL(), body)
	if err != nil {
		return false, fmt.Errorf("creating database %q on the d1local at %s: %w", id, c.cfg.BaseURL, err)
	}
	var env struct {
		Success bool `json:"success"`
		Result  struct {
			UUID string `json:"uuid"`
		} `json:"result"`
		Errors []ErrorDetail `json:"errors"`
	}
	_ = json.Unmarshal(data, &env)
	switch {
	case env.Success && env.Result.UUID == id:
		return true, nil
	case len(env.Errors) > 0 && env.Errors[0].Code == codeDatabaseExists:
		return false, nil // created meanwhile
	case len(env.Errors) > 0:
		return false, fmt.Errorf("creating database %q on the d1local at %s: HTTP %d, code %d: %s", id, c.cfg.BaseURL, res.StatusCode, env.Errors[0].Code, env.Errors[0].Message)
	}
	return false, fmt.Errorf("creating database %q on the d1local at %s: HTTP %d", id, c.cfg.BaseURL, res.StatusCode)
}

// databasesURL is the account's database collection.
func (c *Client) databasesURL() string {
	return c.cfg.BaseURL + "accounts/" + url.PathEscape(c.cfg.AccountID) + "/d1/database"
}

// apiCall makes a call of Cloudflare's API other than a query, with the
// token, on a call of the budget, and returns the response with its body
// (at most maxResponseBytes), read and closed.
func (c *Client) apiCall(ctx context.Context, method, u string, body []byte) (*http.Response, []byte, error) {
	if e := c.acquire(ctx, &budget.Call{Class: budget.Normal, Lane: c.batch.lane}); e != nil {
		return nil, nil, e
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if *c.auth != "" {
		req.Header.Set("Authorization", *c.auth)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.account.Answered(nil)
		return nil, nil, err
	}
	c.account.Answered(res.Header)
	data, err := readBody(res)
	return res, data, err
}
