package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
)

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
