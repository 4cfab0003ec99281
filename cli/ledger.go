package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/d1idem/d1idem/d1client"
)

// nowSQL is the current time in Unix milliseconds: the injected clock's,
// bound as its parameter, or D1's own when the parameter is NULL. D1's
// clock is the one the ledger (package idem) uses by default, so ages and
// TTL cutoffs here agree with the ledger's takeover decisions whatever this
// machine's clock says.
const nowSQL = "COALESCE(?, CAST(unixepoch('subsec') * 1000 AS INTEGER))"

// nowParam is nowSQL's parameter.
func (o *options) nowParam() any {
	if o.now == nil {
		return nil
	}
	return o.now().UnixMilli()
}

// query builds one statement, keeping its anonymous parameters in the order
// their "?" appear in the text.
type query struct {
	sql    strings.Builder
	params []any
	o      *options
}

func newQuery(o *options) *query { return &query{o: o} }

// add appends SQL text and the parameters of its "?"s.
func (q *query) add(sql string, params ...any) *query {
	if n := strings.Count(sql, "?"); n != len(params) {
		panic(fmt.Sprintf("cli: %d parameters for %d placeholders in %q", len(params), n, sql))
	}
	q.sql.WriteString(sql)
	q.params = append(q.params, params...)
	return q
}

// now appends nowSQL.
func (q *query) now() *query { return q.add(nowSQL, q.o.nowParam()) }

func (q *query) statement() d1client.Statement {
	return d1client.Statement{SQL: q.sql.String(), Params: q.params}
}

// keyRow is one ledger row as the keys commands read it, with the clock's
// time of the read.
type keyRow struct {
	Principal, Key, Status string
	Generation             int64
	CreatedAt, UpdatedAt   int64
	ResponseStatus         *int64
	Now                    int64

	// Only keys get reads these.
	Fingerprint     string
	ResponseHeaders *string
	ResponseBody    *string
}

// summaryColumns are the columns scanSummary reads, ending with the clock.
const summaryColumns = "principal, key, status, generation, created_at, updated_at, response_status"

func scanSummary(r d1client.Row) (keyRow, error) {
	var k keyRow
	err := r.Scan(&k.Principal, &k.Key, &k.Status, &k.Generation, &k.CreatedAt, &k.UpdatedAt, &k.ResponseStatus, &k.Now)
	return k, err
}

// sinceUpdate is how long ago the row was last updated (claimed, taken
// over, renewed by a heartbeat or completed).
func (k keyRow) sinceUpdate() time.Duration {
	return time.Duration(k.Now-k.UpdatedAt) * time.Millisecond
}

func (k keyRow) age() time.Duration {
	return time.Duration(k.Now-k.CreatedAt) * time.Millisecond
}

// stuck reports whether the row is pending and older than ttl: its owner
// is presumed dead, and a retry of the same request would take it over.
func (k keyRow) stuck(ttl time.Duration) bool {
	return k.Status == "pending" && k.sinceUpdate() > ttl
}

// keySummaryJSON is a row in keys list and keys stuck --json.
type keySummaryJSON struct {
	Principal      string `json:"principal"`
	Key            string `json:"key"`
	Status         string `json:"status"`
	Generation     int64  `json:"generation"`
	ResponseStatus *int64 `json:"response_status"`
	CreatedAt      string `json:"created_at"`
	CreatedAtMS    int64  `json:"created_at_ms"`
	UpdatedAt      string `json:"updated_at"`
	UpdatedAtMS    int64  `json:"updated_at_ms"`
	AgeMS          int64  `json:"age_ms"`
	SinceUpdateMS  int64  `json:"since_update_ms"`
	Stuck          bool   `json:"stuck"`
}

func (k keyRow) summaryJSON(ttl time.Duration) keySummaryJSON {
	return keySummaryJSON{
		Principal: k.Principal, Key: k.Key, Status: k.Status, Generation: k.Generation,
		ResponseStatus: k.ResponseStatus,
		CreatedAt:      formatUTC(k.CreatedAt), CreatedAtMS: k.CreatedAt,
		UpdatedAt: formatUTC(k.UpdatedAt), UpdatedAtMS: k.UpdatedAt,
		AgeMS: k.Now - k.CreatedAt, SinceUpdateMS: k.Now - k.UpdatedAt,
		Stuck: k.stuck(ttl),
	}
}

// keyDetailJSON is keys get --json.
type keyDetailJSON struct {
	keySummaryJSON
	Fingerprint         string            `json:"fingerprint"`
	ResponseHeaders     map[string]string `json:"response_headers"`
	ResponseHeadersRaw  *string           `json:"response_headers_raw"`
	ResponseBodyBytes   *int              `json:"response_body_bytes"`
	ResponseBodyPreview *string           `json:"response_body_preview"`
	TTLMS               int64             `json:"ttl_ms"`
}

// headers decodes the stored replay headers (a JSON object of strings).
func (k keyRow) headers() (map[string]string, error) {
	if k.ResponseHeaders == nil {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(*k.ResponseHeaders), &h); err != nil {
		return nil, err
	}
	return h, nil
}

// statusText describes the status for people.
func (k keyRow) statusText(ttl time.Duration) string {
	switch {
	case k.stuck(ttl):
		return fmt.Sprintf("pending, stuck: no update for %s, longer than the %s TTL", formatDuration(k.sinceUpdate()), formatDuration(ttl))
	case k.Status == "pending":
		return fmt.Sprintf("pending: in flight, last updated %s (within the %s TTL)", formatAge(k.sinceUpdate()), formatDuration(ttl))
	case k.Status == "completed":
		return "completed: retries replay the stored response"
	}
	return display(k.Status) + " (not a status of the spec)"
}
