package wrangler_test

import (
	"fmt"

	"github.com/d1idem/d1idem/wrangler"
)

// A database of a wrangler config, by its name, in an environment: the
// environment's account_id (inherited from the top level when it has none)
// and its own d1_databases, with wrangler's defaults for the migrations.
func ExampleConfig_Database() {
	cfg, err := wrangler.Parse("wrangler.toml", []byte(`
name = "orders"
account_id = "0123456789abcdef0123456789abcdef"

[[d1_databases]]
binding = "DB"
database_name = "orders-db"
database_id = "6b4c8e3e-0000-4000-8000-000000000000"

[[env.staging.d1_databases]]
binding = "DB"
database_name = "orders-staging"
database_id = "0c7d1f52-93b8-4e6a-a1d4-5b2e8f9c3a71"
preview_database_id = "local-staging"
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := cfg.Database("staging", "DB")
	if err != nil {
		fmt.Println(err)
		return
	}
	id, _ := d.ID(false)
	preview, _ := d.ID(true)
	fmt.Println(d.Name(), d.AccountID, id, preview)
	fmt.Println(d.MigrationsDir, d.MigrationsTable)
	_, err = cfg.Database("staging", "audit-db")
	fmt.Println(err)
	// Output:
	// orders-staging 0123456789abcdef0123456789abcdef 0c7d1f52-93b8-4e6a-a1d4-5b2e8f9c3a71 local-staging
	// migrations d1_migrations
	// no database named "audit-db" in the d1_databases of env.staging of wrangler.toml (it has: orders-staging)
}
