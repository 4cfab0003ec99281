package d1local_test

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/cloudflare/cloudflare-go/v7/d1"
	"github.com/cloudflare/cloudflare-go/v7/option"

	"github.com/d1idem/d1idem/d1local"
)

// TestCloudflareGoSDK drives d1local's database management, import and
// export endpoints with Cloudflare's own Go SDK (cloudflare-go v7), which
// decodes the envelopes strictly into its typed responses.
func TestCloudflareGoSDK(t *testing.T) {
	srv, err := d1local.New(d1local.Config{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); srv.Close() })
	svc := d1.NewDatabaseService(option.WithBaseURL(ts.URL+"/client/v4/"), option.WithAPIToken("tok"),
		option.WithMaxRetries(0), option.WithHTTPClient(ts.Client()))
	ctx := t.Context()
	// cloudflare-go's param.Field is internal to it: set fields directly.
	var create d1.DatabaseNewParams
	create.AccountID.Value, create.AccountID.Present = d1local.DefaultAccountID, true
	create.Name.Value, create.Name.Present = "orders", true
	acc := create.AccountID

	sdkNew(t, svc, create)

	var query d1.DatabaseQueryParamsBodyD1SingleQuery
	query.Sql.Value, query.Sql.Present = "CREATE TABLE o (id INTEGER PRIMARY KEY, item TEXT)", true
	if _, err := svc.Query(ctx, "orders", d1.DatabaseQueryParams{AccountID: acc, Body: query}); err != nil {
		t.Fatalf("Query: %v", err)
	}

	sdkImport(t, svc, ts, d1.DatabaseImportParams{AccountID: acc}, []byte("INSERT INTO o (item) VALUES ('apple'), ('pear');"))

	got, err := svc.Get(ctx, "orders", d1.DatabaseGetParams{AccountID: acc})
	if err != nil || got.NumTables != 1 || got.FileSize <= 0 {
		t.Errorf("Get: %v %s", err, got.JSON.RawJSON())
	}
	page, err := svc.List(ctx, d1.DatabaseListParams{AccountID: acc})
	if err != nil || len(page.Result) != 1 || page.Result[0].UUID != "orders" {
		t.Errorf("List: %v %+v", err, page)
	}

	export := d1.DatabaseExportParams{AccountID: acc}
	export.OutputFormat.Value, export.OutputFormat.Present = d1.DatabaseExportParamsOutputFormatPolling, true
	var opts d1.DatabaseExportParamsDumpOptions
	opts.NoSchema.Value, opts.NoSchema.Present = true, true
	export.DumpOptions.Value, export.DumpOptions.Present = opts, true
	sdkExport(t, svc, ts, export, "PRAGMA defer_foreign_keys=TRUE;\nINSERT INTO \"o\" VALUES(1,'apple');\nINSERT INTO \"o\" VALUES(2,'pear');\n")

	if _, err := svc.Delete(ctx, "orders", d1.DatabaseDeleteParams{AccountID: acc}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	_, err = svc.Get(ctx, "orders", d1.DatabaseGetParams{AccountID: acc})
	var apiErr *d1.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Errors[0].Code != 7404 {
		t.Errorf("Get after Delete: %v", err)
	}
	if ids, _ := srv.Databases(); !slices.Equal(ids, []string{}) {
		t.Errorf("Databases() = %q", ids)
	}
}

// sdkNew creates the database "orders" with create, and checks the SDK's
// view of it, and that a second New of the name is refused (7502).
func sdkNew(t *testing.T, svc *d1.DatabaseService, create d1.DatabaseNewParams) {
	t.Helper()
	ctx := t.Context()
	db, err := svc.New(ctx, create)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if db.UUID != "orders" || db.Name != "orders" || db.Version != "production" ||
		db.ReadReplication.Mode != d1.D1ReadReplicationModeDisabled {
		t.Errorf("New = %s", db.JSON.RawJSON())
	}
	_, err = svc.New(ctx, create)
	var apiErr *d1.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || len(apiErr.Errors) != 1 || apiErr.Errors[0].Code != 7502 {
		t.Errorf("New of an existing name: %v", err)
	}
}

// sdkImport imports sql, one statement, into "orders" the way the API
// documents it: init, upload to ts, ingest, then poll. base carries the
// account; each step sets its body.
func sdkImport(t *testing.T, svc *d1.DatabaseService, ts *httptest.Server, base d1.DatabaseImportParams, sql []byte) {
	t.Helper()
	ctx := t.Context()
	sum := md5.Sum(sql)
	etag := hex.EncodeToString(sum[:])
	var initBody d1.DatabaseImportParamsBodyInit
	initBody.Action.Value, initBody.Action.Present = d1.DatabaseImportParamsBodyInitActionInit, true
	initBody.Etag.Value, initBody.Etag.Present = etag, true
	p := base
	p.Body = initBody
	init, err := svc.Import(ctx, "orders", p)
	if err != nil || init.UploadURL == "" || init.Filename == "" {
		t.Fatalf("Import init: %+v, %v", init, err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, init.UploadURL, bytes.NewReader(sql))
	resp, err := ts.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %v %v", resp, err)
	}
	resp.Body.Close()
	var ingest d1.DatabaseImportParamsBodyIngest
	ingest.Action.Value, ingest.Action.Present = d1.DatabaseImportParamsBodyIngestActionIngest, true
	ingest.Etag.Value, ingest.Etag.Present = etag, true
	ingest.Filename.Value, ingest.Filename.Present = init.Filename, true
	p.Body = ingest
	done, err := svc.Import(ctx, "orders", p)
	if err != nil || !done.Success || done.Status != d1.DatabaseImportResponseStatusComplete ||
		done.Result.NumQueries != 1 || done.Result.Meta.RowsWritten != 2 {
		t.Fatalf("Import ingest: %v\n%s", err, done.JSON.RawJSON())
	}
	var poll d1.DatabaseImportParamsBodyPoll
	poll.Action.Value, poll.Action.Present = d1.DatabaseImportParamsBodyPollActionPoll, true
	poll.CurrentBookmark.Value, poll.CurrentBookmark.Present = done.AtBookmark, true
	p.Body = poll
	polled, err := svc.Import(ctx, "orders", p)
	if err != nil || polled.Status != d1.DatabaseImportResponseStatusComplete {
		t.Errorf("Import poll: %v %+v", err, polled)
	}
}

// sdkExport exports "orders" with export, downloads the dump from ts,
// and checks it is want.
func sdkExport(t *testing.T, svc *d1.DatabaseService, ts *httptest.Server, export d1.DatabaseExportParams, want string) {
	t.Helper()
	exp, err := svc.Export(t.Context(), "orders", export)
	if err != nil || exp.Status != d1.DatabaseExportResponseStatusComplete || exp.Result.SignedURL == "" {
		t.Fatalf("Export: %v %+v", err, exp)
	}
	resp, err := ts.Client().Get(exp.Result.SignedURL)
	if err != nil {
		t.Fatal(err)
	}
	dump, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(dump) != want {
		t.Errorf("export:\n%s\nwant:\n%s", dump, want)
	}
}
