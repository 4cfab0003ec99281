package bridge

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/d1idem/d1idem/wrangler"
)

// Config is a deployment of the bridge: what its wrangler.toml says, which
// `d1idem bridge init` writes.
type Config struct {
	Worker    string     `json:"worker"`               // the Worker's name
	AccountID string     `json:"account_id,omitempty"` // "" when wrangler is to find it
	Mode      string     `json:"mode"`                 // "full", or "ledger-only": only the ledger's statements
	Databases []Database `json:"databases"`
}

// Database is one D1 database the bridge serves, under its ID and name.
type Database struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Binding string `json:"binding"`
}

// workerPattern is a Worker name Cloudflare accepts.
var workerPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidWorkerName reports whether Cloudflare accepts name as a Worker's:
// lower-case letters, digits and '-', at most 63.
func ValidWorkerName(name string) bool { return workerPattern.MatchString(name) }

// bindingPattern is a D1 binding name the bridge accepts: a JavaScript
// identifier of ASCII letters, digits and underscores.
var bindingPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidBinding reports whether the bridge accepts name as a D1 binding's.
func ValidBinding(name string) bool { return bindingPattern.MatchString(name) }

// BindingName makes a binding name of a database name: "orders-db" is
// ORDERS_DB, "2024-audit" DB_2024_AUDIT.
func BindingName(name string) string {
	b := []byte(strings.ToUpper(name))
	for i, ch := range b {
		if !(ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9') {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		return "DB_" + string(b)
	}
	return string(b)
}

// DefaultWorker is the bridge Worker's name when none is given.
const DefaultWorker = "d1idem-bridge"

// WorkerName is the bridge Worker's name for the wrangler environment env:
// DefaultWorker, with "-" and env lower-cased after it for an environment
// ("d1idem-bridge-staging").
func WorkerName(env string) string {
	if env == "" {
		return DefaultWorker
	}
	return DefaultWorker + "-" + strings.ToLower(env)
}

// idLike is what a database name, ID or account ID may look like in the
// bridge's wrangler.toml.
var idLike = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// DatabaseOf resolves a database the bridge is to serve, named as 'd1idem
// bridge init --database' names it: "NAME=ID" as given, under the binding
// BindingName(NAME); or "NAME", the database_name or binding of an entry of
// the wrangler config cfg's environment env ("" for the top level), whose
// account_id it returns too. cfg may be nil when arg has its ID. An error
// says what is wrong with arg, without repeating it.
func DatabaseOf(cfg *wrangler.Config, env, arg string) (d Database, accountID string, err error) {
	name, id, explicit := strings.Cut(arg, "=")
	switch {
	case !idLike.MatchString(name) || explicit && !idLike.MatchString(id):
		return Database{}, "", errors.New("expected NAME or NAME=ID, each of letters, digits, '.', '_' and '-'")
	case explicit:
		return Database{Name: name, ID: id, Binding: BindingName(name)}, "", nil
	case cfg == nil:
		return Database{}, "", fmt.Errorf("no wrangler config to find it in: give it as %s=ID", name)
	}
	wd, err := cfg.Database(env, name)
	if err != nil {
		return Database{}, "", fmt.Errorf("%w; or give it as %s=ID", err, name)
	}
	if id, err = wd.ID(false); err != nil {
		return Database{}, "", fmt.Errorf("%w in %s", err, wd.ConfigPath)
	}
	if !idLike.MatchString(id) || !ValidBinding(wd.Binding) || wd.AccountID != "" && !idLike.MatchString(wd.AccountID) {
		return Database{}, "", fmt.Errorf("database %q of %s: its binding, database_id or account_id is not one the bridge can use", name, wd.ConfigPath)
	}
	return Database{Name: wd.Name(), ID: id, Binding: wd.Binding}, wd.AccountID, nil
}

// CheckDatabases refuses a binding of the bridge's settings (BRIDGE_*), two
// databases that share a binding, and a name or ID that would reach two.
func (c Config) CheckDatabases() error {
	bindings, keys := map[string]string{}, map[string]string{}
	for _, d := range c.Databases {
		if strings.HasPrefix(d.Binding, "BRIDGE_") {
			return fmt.Errorf("database %s: its binding %s would clash with the bridge's settings (BRIDGE_*); rename the binding", d.Name, d.Binding)
		}
		if prev, ok := bindings[d.Binding]; ok {
			return fmt.Errorf("databases %s and %s would share the binding %s; name each database once", prev, d.Name, d.Binding)
		}
		bindings[d.Binding] = d.Name
		for _, k := range []string{d.ID, d.Name} {
			if prev, ok := keys[k]; ok && prev != d.Binding {
				return fmt.Errorf("%q names two databases; the bridge must know which one a request means", k)
			}
			keys[k] = d.Binding
		}
	}
	return nil
}

// WranglerTOML is the bridge's wrangler.toml; source, if not "", says in
// its first comment where the databases came from.
func (c Config) WranglerTOML(source string) []byte {
	var b strings.Builder
	from := ""
	if source != "" {
		from = " from " + source
	}
	fmt.Fprintf(&b, `# The d1idem bridge: D1's REST API served by this Worker on its D1 bindings,
# past the account's API budget. Written by 'd1idem bridge init'%s.
#
#   d1idem bridge deploy DIR   deploys it, with a new secret (BRIDGE_SECRET)
#   wrangler dev --local       runs it on 127.0.0.1, in workerd, with the
#                              development secret of .dev.vars
name = %q
main = "worker.js"
compatibility_date = %q
workers_dev = true
`, from, c.Worker, CompatibilityDate)
	if c.AccountID != "" {
		fmt.Fprintf(&b, "account_id = %q\n", c.AccountID)
	}
	for _, d := range c.Databases {
		fmt.Fprintf(&b, "\n[[d1_databases]]\nbinding = %q\ndatabase_name = %q\ndatabase_id = %q\n", d.Binding, d.Name, d.ID)
	}
	fmt.Fprintf(&b, `
[vars]
# "full": any SQL, as the REST API. "ledger-only": only the ledger's own
# statements (ledger-statements.js) and those of BRIDGE_ALLOWED_STATEMENTS,
# byte for byte (list your idemhttp.Tx statements there), so that a leaked secret
# cannot read or change other tables.
BRIDGE_MODE = %q
# BRIDGE_ALLOWED_STATEMENTS = [
#   "INSERT INTO orders (id, sku) VALUES (?, ?)",
# ]

# Which database IDs and names reach which binding; anything else gets 404
# (code 7404).
[vars.BRIDGE_DATABASES]
`, c.Mode)
	for _, d := range c.Databases {
		fmt.Fprintf(&b, "%q = %q\n", d.ID, d.Binding)
		if d.Name != d.ID {
			fmt.Fprintf(&b, "%q = %q\n", d.Name, d.Binding)
		}
	}
	return []byte(b.String())
}

// NewSecret returns a new bridge secret: 32 random bytes, in hex.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidSecret reports whether the bridge accepts s as its secret (see
// SECRET_PATTERN in worker.js): 16 to 4096 visible ASCII characters, no
// commas.
func ValidSecret(s string) bool {
	if len(s) < 16 || len(s) > 4096 {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x21 || r > 0x7e || r == ',' }) < 0
}
