package schema

import "encoding/json"

// MarshalText names the action in JSON: "create", "record", "repair" or
// "nothing".
func (a Action) MarshalText() ([]byte, error) {
	switch a {
	case CreateAndRecord:
		return []byte("create"), nil
	case RecordOnly:
		return []byte("record"), nil
	case Repair:
		return []byte("repair"), nil
	}
	return []byte("nothing"), nil
}

// MarshalJSON writes the result with its action's name (action) and
// description (description), whether it was a dry run (dry_run), the
// migration names (migration, the first; migrations), the migrations table
// (migrations_table) and the statements as a script (sql, Result.SQL).
func (r Result) MarshalJSON() ([]byte, error) {
	first := ""
	if len(r.Migrations) > 0 {
		first = r.Migrations[0]
	}
	migrations := r.Migrations
	if migrations == nil {
		migrations = []string{}
	}
	return json.Marshal(struct {
		Action          Action   `json:"action"`
		Description     string   `json:"description"`
		DryRun          bool     `json:"dry_run"`
		Migration       string   `json:"migration"`
		Migrations      []string `json:"migrations"`
		MigrationsTable string   `json:"migrations_table"`
		SQL             string   `json:"sql"`
	}{r.Action, r.Action.String(), r.DryRun, first, migrations, r.MigrationsTable, r.SQL()})
}
