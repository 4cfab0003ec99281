package cli

// The JSON the commands print, as the tests decode it: the field names of
// --json, which scripts rely on (TestJSONGolden keeps them all).

// keySummaryJSON is a row in keys list and keys stuck --json.
type keySummaryJSON struct {
	Principal      string `json:"principal"`
	Key            string `json:"key"`
	Status         string `json:"status"`
	State          string `json:"state"`
	Generation     int64  `json:"generation"`
	ResponseStatus *int64 `json:"response_status"`
	CreatedAt      string `json:"created_at"`
	UpdatedAt      string `json:"updated_at"`
	SinceUpdateMS  int64  `json:"since_update_ms"`
	Stuck          bool   `json:"stuck"`
}

// keyDetailJSON is keys get --json.
type keyDetailJSON struct {
	keySummaryJSON
	Fingerprint     string            `json:"fingerprint"`
	ResponseHeaders map[string]string `json:"response_headers"`
	ResponseBody    *string           `json:"response_body"`
	Database        string            `json:"database"`
}

// releaseJSON is keys release --json.
type releaseJSON struct {
	Released       bool   `json:"released"`
	FromGeneration int64  `json:"from_generation"`
	ToGeneration   int64  `json:"to_generation"`
	Action         string `json:"action"`
	FromStatus     string `json:"from_status"`
	State          string `json:"state"`
	Forced         bool   `json:"forced"`
	SinceUpdateMS  int64  `json:"since_update_ms"`
}

// projectionJSON is the 10 GB projection under --json.
type projectionJSON struct {
	Reason *string `json:"not_enough_data"`
}

// statsJSON is stats --json on one database.
type statsJSON struct {
	Database     string           `json:"database"`
	Keys         int64            `json:"keys"`
	ByStatus     map[string]int64 `json:"by_status"`
	TTLMS        int64            `json:"ttl_ms"`
	Stuck        int64            `json:"stuck"`
	OldestStuck  *keySummaryJSON  `json:"oldest_stuck"`
	Oldest       *keySummaryJSON  `json:"oldest"`
	RetentionMS  int64            `json:"retention_ms"`
	SweepBacklog int64            `json:"sweep_backlog"`
	SizeBytes    int64            `json:"size_bytes"`
	SizeLimit    *projectionJSON  `json:"size_limit"`
}

// statsManyJSON is stats --json over several databases.
type statsManyJSON struct {
	statsJSON
	Databases []struct {
		statsJSON
		ID    string  `json:"id"`
		Error *string `json:"error"`
	} `json:"databases"`
}

// sweepJSON is sweep --json.
type sweepJSON struct {
	DryRun      bool   `json:"dry_run"`
	WouldDelete *int64 `json:"would_delete"`
	Deleted     int64  `json:"deleted"`
	Batches     int64  `json:"batches"`
	Complete    bool   `json:"complete"`
	D1Calls     int64  `json:"d1_calls"`
	BudgetWaits int    `json:"budget_waits"`
	Databases   []struct {
		ID      string `json:"id"`
		Deleted int64  `json:"deleted"`
	} `json:"databases"`
}

// applyJSON is schema apply --json on one database.
type applyJSON struct {
	Action          string   `json:"action"`
	DryRun          bool     `json:"dry_run"`
	Migration       string   `json:"migration"`
	Migrations      []string `json:"migrations"`
	MigrationsTable string   `json:"migrations_table"`
	MigrationsDir   string   `json:"migrations_dir"`
	Database        string   `json:"database"`
	SQL             string   `json:"sql"`
	CreatedDatabase bool     `json:"created_database"`
}

// verifyJSON is schema verify --json on one database.
type verifyJSON struct {
	Matches bool     `json:"matches"`
	Diff    []string `json:"diff"`
	Columns int      `json:"columns"`
	Indexes int      `json:"indexes"`
}

// budgetJSON is the API budget of stats --watch --json.
type budgetJSON struct {
	Remaining int `json:"remaining"`
	Policy    *struct {
		Quota    int   `json:"quota"`
		WindowMS int64 `json:"window_ms"`
	} `json:"policy"`
}
