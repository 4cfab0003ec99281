package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
)

// The calls of Cloudflare's API that d1client does not make: the database
// list, for the error that names a missing database, and a database's
// creation on a d1local server, for schema apply.

// maxListed bounds the databases a missing-database error names.
const maxListed = 50

// listCloudflare lists the account's D1 databases, "name (uuid)" each, with
// the client's base URL and the token: Cloudflare's database list
// (GET accounts/{account}/d1/database, paged), or a d1local server's (where a
// database's name is its ID).
func listCloudflare(ctx context.Context, db *d1client.Client, hc *http.Client, token string) ([]string, error) {
	out := []string{}
	for page := 1; len(out) < maxListed; page++ {
		dbs, more, err := listPage(ctx, hc, db.BaseURL(), db.AccountID(), token, page)
		if err != nil {
			return nil, err
		}
		for _, d := range dbs {
			if d.Name == d.UUID || d.UUID == "" {
				out = append(out, d.Name)
			} else {
				out = append(out, d.Name+" ("+d.UUID+")")
			}
		}
		if !more || len(dbs) == 0 {
			break
		}
	}
	return out[:min(len(out), maxListed)], nil
}

// listedDatabase is one entry of Cloudflare's database list.
type listedDatabase struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// listPage fetches one page of the database list and reports whether more
// pages follow.
func listPage(ctx context.Context, hc *http.Client, base, account, token string, page int) ([]listedDatabase, bool, error) {
	const perPage = 100
	u := fmt.Sprintf("%saccounts/%s/d1/database?per_page=%d&page=%d", base, url.PathEscape(account), perPage, page)
	res, body, err := apiRequest(ctx, hc, http.MethodGet, u, token, nil)
	if err != nil {
		return nil, false, fmt.Errorf("listing the databases: %w", err)
	}
	var env struct {
		Success    bool             `json:"success"`
		Result     []listedDatabase `json:"result"`
		ResultInfo struct {
			Page       int `json:"page"`
			TotalCount int `json:"total_count"`
		} `json:"result_info"`
	}
	if err := json.Unmarshal(body, &env); err != nil || !env.Success {
		return nil, false, fmt.Errorf("listing the databases: HTTP %d", res.StatusCode)
	}
	more := len(env.Result) == perPage && page*perPage < env.ResultInfo.TotalCount
	return env.Result, more, nil
}

// apiRequest makes a call of Cloudflare's API that d1client does not make
// (the database list, a database's creation), with the token, and returns
// the response with its body (at most 8 MiB), read and closed.
func apiRequest(ctx context.Context, hc *http.Client, method, u, token string, body []byte) (*http.Response, []byte, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	return res, data, err
}

// createOnD1local creates the database of db when the server db reaches is
// d1local (its answers carry d1local's Server header) and has no such
// database, through the create endpoint wrangler's 'd1 create' uses; it
// says what it created, "" when nothing. On d1local a database's ID is its
// name. A server that is not d1local, or does not answer, is left alone: on
// D1 a database is created by wrangler or the dashboard, which give it its
// UUID, and a create call here would make one under another ID than the
// one asked for.
func createOnD1local(ctx context.Context, db *d1client.Client, hc *http.Client, token string) (string, error) {
	id := db.DatabaseID()
	databases := db.BaseURL() + "accounts/" + url.PathEscape(db.AccountID()) + "/d1/database"
	res, _, err := apiRequest(ctx, hc, http.MethodGet, databases+"/"+url.PathEscape(id), token, nil)
	if err != nil || res.StatusCode != http.StatusNotFound || res.Header.Get("Server") != d1local.ServerName {
		return "", nil
	}
	body, err := json.Marshal(map[string]string{"name": id})
	if err != nil {
		return "", err
	}
	res, data, err := apiRequest(ctx, hc, http.MethodPost, databases, token, body)
	if err != nil {
		return "", fmt.Errorf("creating database %q on the d1local at %s: %w", id, db.BaseURL(), err)
	}
	var env struct {
		Success bool `json:"success"`
		Result  struct {
			UUID string `json:"uuid"`
		} `json:"result"`
		Errors []apiErrorEntry `json:"errors"`
	}
	_ = json.Unmarshal(data, &env)
	switch {
	case env.Success && env.Result.UUID == id:
		return fmt.Sprintf("database %q on the d1local at %s", id, db.BaseURL()), nil
	case len(env.Errors) > 0 && env.Errors[0].Code == codeDatabaseExists:
		return "", nil // created meanwhile
	case len(env.Errors) > 0:
		return "", fmt.Errorf("creating database %q on the d1local at %s: HTTP %d, code %d: %s", id, db.BaseURL(), res.StatusCode, env.Errors[0].Code, env.Errors[0].Message)
	}
	return "", fmt.Errorf("creating database %q on the d1local at %s: HTTP %d", id, db.BaseURL(), res.StatusCode)
}

// apiErrorEntry is an entry of the errors of Cloudflare's envelope.
type apiErrorEntry struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// codeDatabaseExists is D1's error code for creating a database whose name
// is taken.
const codeDatabaseExists = 7502
