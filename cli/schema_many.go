package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/d1idem/d1idem"
	"github.com/d1idem/d1idem/schema"
)

// applyManyJSON is one database of schema apply --json over several.
type applyManyJSON struct {
	applyJSON
	ID    string   `json:"id"`
	Error *string  `json:"error"`
	Diff  []string `json:"diff,omitempty"`
}

// schemaApplyMany applies the schema to each database, reporting each, and
// fails if any failed.
func schemaApplyMany(c *cli.Context, s *dbSet) error {
	w, asJSON := c.App.Writer, c.Bool(flagJSON)
	var outs []applyManyJSON
	var failed []string
	for _, cn := range s.conns {
		out, res, err := applyOne(c, cn)
		err = cn.named(c, err)
		j := applyManyJSON{applyJSON: out, ID: cn.databaseID}
		j.Database = cn.where
		var drift *schema.DriftError
		switch {
		case errors.As(err, &drift):
			failed = append(failed, fmt.Sprintf("%s: %s differs from schema.sql (%s)", cn.label(), d1idem.Table, plural(int64(len(drift.Diff)), "difference", "differences")))
			if !asJSON {
				fmt.Fprintf(w, "On %s: ", cn.where)
				_ = printDiff(w, drift.Diff)
			}
			j.Diff = drift.Diff
		case err != nil:
			failed = append(failed, cn.label()+": "+describe(err))
		case !asJSON:
			renderCreated(w, out)
			if err := renderApply(w, res, out.DryRun, out.MigrationsTable, cn.where); err != nil {
				return err
			}
		}
		if err != nil {
			msg := describe(err)
			j.Error = &msg
		}
		outs = append(outs, j)
	}
	if asJSON {
		if err := printJSON(w, struct {
			Databases []applyManyJSON `json:"databases"`
		}{outs}); err != nil {
			return err
		}
	} else if !c.Bool("dry-run") && len(failed) < len(s.conns) {
		if err := checkLine(c); err != nil {
			return err
		}
	}
	return failedOn("schema apply", failed, len(s.conns))
}

// failedOn is the error of a command that failed on some of n databases.
func failedOn(cmd string, failed []string, n int) error {
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%s failed on %d of %d databases: %s", cmd, len(failed), n, strings.Join(failed, "; "))
}

// verifyManyJSON is one database of schema verify --json over several.
type verifyManyJSON struct {
	Database string `json:"database"`
	ID       string `json:"id"`
	verifyJSON
	Error *string `json:"error"`
}

// schemaVerifyMany verifies each database, reporting each, and fails if
// any differs from schema.sql or cannot be read.
func schemaVerifyMany(c *cli.Context, s *dbSet) error {
	w, asJSON := c.App.Writer, c.Bool(flagJSON)
	var outs []verifyManyJSON
	var failed []string
	for _, cn := range s.conns {
		err := cn.named(c, schema.Verify(c.Context, cn.db))
		var drift *schema.DriftError
		j := verifyManyJSON{Database: cn.where, ID: cn.databaseID}
		switch {
		case errors.As(err, &drift) && drift.Missing:
			failed = append(failed, fmt.Sprintf("%s: %s does not exist (run 'd1idem schema apply%s')", cn.label(), d1idem.Table, connHint(c)))
		case errors.As(err, &drift):
			failed = append(failed, fmt.Sprintf("%s: %s differs from schema.sql (%s, shown on stdout)", cn.label(), d1idem.Table, plural(int64(len(drift.Diff)), "difference", "differences")))
		case err != nil:
			failed = append(failed, cn.label()+": "+describe(err))
			msg := describe(err)
			j.Error = &msg
		}
		if drift != nil || err == nil {
			j.verifyJSON = verifyJSONOf(drift)
		}
		if !asJSON && (drift != nil || err == nil) {
			if drift != nil {
				fmt.Fprintf(w, "On %s: ", cn.where)
			}
			if err := renderVerify(w, drift, cn.where); err != nil {
				return err
			}
		}
		outs = append(outs, j)
	}
	if asJSON {
		if err := printJSON(w, struct {
			Databases []verifyManyJSON `json:"databases"`
		}{outs}); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("schema drift on %d of %d databases: %s", len(failed), len(s.conns), strings.Join(failed, "; "))
	}
	return nil
}
