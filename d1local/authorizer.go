package d1local

import (
	"strconv"
	"strings"

	sqlite3 "modernc.org/sqlite/lib"
)

// The D1 authorizer, modelled on workerd's SqliteDatabase::authorize and
// SqlStorageRegulator (src/workerd/util/sqlite.c++), which local D1 runs and
// production D1 is built on. It applies only while user SQL is compiled
// (conn.setAuthorizer); the server's own BEGIN, COMMIT and PRAGMAs run
// without it.

const (
	authOK   = sqlite3.SQLITE_OK
	authDeny = sqlite3.SQLITE_DENY
)

// authorize decides whether user SQL may perform action. The arguments are
// those of sqlite3_set_authorizer's callback: two action-specific strings,
// the schema name and the innermost trigger or view. It is a pure function.
func authorize(action int32, arg1, arg2, dbName, _ string) int32 {
	if strings.EqualFold(dbName, "temp") {
		// No TEMP objects, however named ("CREATE TABLE temp.t" is
		// presented as SQLITE_CREATE_TABLE in schema "temp"). The temp
		// schema table, the only table there, may be read and updated, as
		// on workerd: ALTER TABLE ... RENAME does both (SQLite itself
		// refuses direct writes to it).
		if action == sqlite3.SQLITE_READ ||
			(action == sqlite3.SQLITE_UPDATE && strings.EqualFold(arg1, "sqlite_temp_master")) {
			return authOK
		}
		return authDeny
	}
	allow := false
	switch action {
	case sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE:
		allow = true
	case sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_VIEW,
		sqlite3.SQLITE_DROP_TABLE, sqlite3.SQLITE_DROP_VIEW,
		sqlite3.SQLITE_DROP_VTABLE, sqlite3.SQLITE_REINDEX:
		// arg1: the object (for REINDEX the index or collation).
		allow = allowedName(arg1)
	case sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_TRIGGER,
		sqlite3.SQLITE_DROP_INDEX, sqlite3.SQLITE_DROP_TRIGGER:
		// arg1: the index or trigger; arg2: its table.
		allow = allowedName(arg1) && allowedName(arg2)
	case sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_READ:
		// arg1: the table (arg2: the column, for READ and UPDATE).
		allow = allowedName(arg1) && !internalTable(arg1)
	case sqlite3.SQLITE_ALTER_TABLE:
		// arg1: the schema; arg2: the table.
		allow = allowedName(arg2)
	case sqlite3.SQLITE_ANALYZE:
		allow = arg1 == "" || allowedName(arg1)
	case sqlite3.SQLITE_CREATE_VTABLE:
		// arg1: the table; arg2: the module.
		allow = allowedName(arg1) && allowedModule(arg2)
	case sqlite3.SQLITE_FUNCTION:
		// arg2: the function name.
		allow = allowedFunction(arg2)
	case sqlite3.SQLITE_PRAGMA:
		// arg1: the pragma; arg2: its argument, if any.
		allow = allowedPragma(arg1, arg2)
	default:
		// SQLITE_TRANSACTION and SQLITE_SAVEPOINT (D1 runs every request
		// in its own transaction), SQLITE_ATTACH, SQLITE_DETACH, every
		// TEMP object and anything newer than this list.
		allow = false
	}
	if allow {
		return authOK
	}
	return authDeny
}

// allowedName reports whether a table, index, view or trigger name is not
// reserved: D1 reserves every name starting with "_cf_", in lower case
// ("_CF_x" and "_Cf_x" are ordinary names on workerd).
func allowedName(name string) bool {
	return !strings.HasPrefix(name, "_cf_")
}

// internalTable reports whether name is one of the virtual tables this
// SQLite build has and workerd's does not, which expose the raw database.
func internalTable(name string) bool {
	return strings.EqualFold(name, "sqlite_dbpage") || strings.EqualFold(name, "dbstat")
}

// allowedModule reports whether CREATE VIRTUAL TABLE may use module; D1
// allows the full-text and R*Tree modules only.
func allowedModule(module string) bool {
	switch strings.ToLower(module) {
	case "fts5", "fts5vocab", "rtree", "rtree_i32":
		return true
	}
	return false
}

// allowedFunction reports whether an SQL function may be called. D1 allows
// an explicit list of SQLite's built-in functions; d1local refuses only
// those that reveal the SQLite build or load code, and allows the rest.
func allowedFunction(name string) bool {
	switch strings.ToLower(name) {
	case "sqlite_version", "sqlite_source_id",
		"sqlite_compileoption_used", "sqlite_compileoption_get",
		"load_extension":
		return false
	}
	return true
}

// allowedPragma applies D1's PRAGMA allowlist. arg is the pragma's
// argument ("" when there is none), already dequoted by SQLite.
func allowedPragma(name, arg string) bool {
	switch strings.ToLower(name) {
	case "data_version":
		return arg == ""
	case "table_list":
		return arg == "" || allowedName(arg)
	case "page_size":
		return arg == "" // reading only
	case "table_info", "table_xinfo", "index_info", "index_xinfo", "index_list", "foreign_key_list":
		return arg != "" && allowedName(arg)
	case "foreign_key_check":
		return arg == "" || allowedName(arg)
	case "quick_check":
		return arg == "" || isInteger(arg) || allowedName(arg)
	case "optimize":
		return arg == "" || isInteger(arg)
	case "case_sensitive_like", "foreign_keys", "defer_foreign_keys",
		"ignore_check_constraints", "legacy_alter_table",
		"recursive_triggers", "reverse_unordered_selects":
		return arg == "" || isBoolean(arg)
	}
	return false
}

// isBoolean reports whether arg is one of SQLite's boolean PRAGMA values.
func isBoolean(arg string) bool {
	switch strings.ToLower(arg) {
	case "0", "1", "on", "off", "true", "false", "yes", "no":
		return true
	}
	return false
}

// isInteger reports whether arg is a decimal or hexadecimal integer.
func isInteger(arg string) bool {
	s := strings.TrimPrefix(arg, "-")
	if _, err := strconv.ParseUint(s, 10, 64); err == nil {
		return true
	}
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		_, err := strconv.ParseUint(s[2:], 16, 64)
		return err == nil
	}
	return false
}

// transactionMessage is the error workerd gives for BEGIN, COMMIT,
// ROLLBACK, SAVEPOINT and RELEASE, locally and (per workerd#5411) in
// production.
const transactionMessage = "To execute a transaction, please use the state.storage.transaction() or " +
	"state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or SAVEPOINT statements. " +
	"The JavaScript API is safer because it will automatically roll back on exceptions, and because it " +
	"interacts correctly with Durable Objects' automatic atomic write coalescing."

// isTransactionKeyword reports whether a statement starting with keyword
// controls transactions.
func isTransactionKeyword(keyword string) bool {
	switch keyword {
	case "BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE":
		return true
	}
	return false
}
