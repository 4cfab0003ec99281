package idemclient

// Header names of the protocol: the request's key, the mark of a replayed
// answer (Stripe's spelling) and the server's hint of when to retry.
const (
	HeaderKey        = "Idempotency-Key"
	HeaderReplayed   = "Idempotent-Replayed"
	HeaderRetryAfter = "Retry-After"
)

// Error codes of the JSON bodies a d1idem server answers with,
// {"error": code, "message": ...}. The first five are the spec's; the rest
// are d1idem's answers to what the spec leaves open. Package idemhttp's
// constants of the same names are these.
const (
	// CodeKeyRequired (400): the request has no Idempotency-Key.
	CodeKeyRequired = "idempotency_key_required"
	// CodeKeyInvalid (400): the key is not 1-255 printable ASCII
	// characters, or the request has two keys.
	CodeKeyInvalid = "idempotency_key_invalid"
	// CodeKeyReused (409, or 422): the key was used for a different request.
	CodeKeyReused = "idempotency_key_reused"
	// CodeKeyInProgress (409): the key's first request is still running;
	// the body's retry_after_ms and the Retry-After header say when to retry.
	CodeKeyInProgress = "idempotency_key_in_progress"
	// CodeKeyRetry (409): the key's row vanished under the request; retry.
	CodeKeyRetry = "idempotency_key_retry"
	// CodeUnauthenticated (401): the server could not authenticate the caller.
	CodeUnauthenticated = "unauthenticated"
	// CodePrincipalInvalid (500): the server derived an invalid principal:
	// its bug, which a retry cannot fix.
	CodePrincipalInvalid = "idempotency_principal_invalid"
	// CodeBodyTooLarge (413): the request body is over the server's limit.
	CodeBodyTooLarge = "request_body_too_large"
	// CodeBodyUnreadable (400): the server could not read the request body.
	CodeBodyUnreadable = "request_body_unreadable"
	// CodeLedgerUnavailable (503): the server could not reach its ledger and
	// ran nothing; Retry-After says when to retry.
	CodeLedgerUnavailable = "idempotency_ledger_unavailable"
	// CodeLedgerMisconfigured (500): the server's ledger refuses it (its
	// token, database or schema); nothing ran, and no retry can succeed
	// until the server's operators fix it.
	CodeLedgerMisconfigured = "idempotency_ledger_misconfigured"
	// CodeBudgetExhausted (503): the server's ledger is out of API budget
	// and ran nothing; Retry-After says when to retry.
	CodeBudgetExhausted = "idempotency_budget_exhausted"
	// CodeLedgerBusy (503): more requests wait for the server's ledger than
	// it can answer in time, so this one was turned away at once and ran
	// nothing; Retry-After says when to retry.
	CodeLedgerBusy = "idempotency_ledger_busy"
	// CodeRecordUnreadable (500): the stored answer for the key cannot be
	// decoded; nothing was run again, and a retry gets the same.
	CodeRecordUnreadable = "idempotency_record_unreadable"
	// CodeMutationAbandoned: the handler's writes were not committed. With
	// 503 the ledger could not be reached (retry: it runs again, or replays
	// if they did commit); with 500 they failed, and a retry would fail the
	// same way.
	CodeMutationAbandoned = "idempotency_mutation_not_committed"
)

// codeStripeInUse is the code of Stripe's 409 for a key whose first request
// is still running.
const codeStripeInUse = "idempotency_key_in_use"
