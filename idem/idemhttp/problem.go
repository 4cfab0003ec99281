package idemhttp

import "net/http"

// problemContentType is RFC 9457's media type for problem details.
const problemContentType = "application/problem+json"

// ProblemTypeBase is the start of the "type" URI of the middleware's problem
// details (Options.ProblemDetails): the error code follows it, naming its
// row of the guide's table of answers.
const ProblemTypeBase = "https://github.com/d1idem/d1idem/blob/main/docs/guide.md#"

// problemTitles are the problem types' titles, by error code; a code without
// one is titled with its status's text.
var problemTitles = map[string]string{
	CodeKeyRequired:         "Idempotency-Key required",
	CodeKeyInvalid:          "Invalid Idempotency-Key",
	CodeKeyReused:           "Idempotency-Key reused",
	CodeKeyInProgress:       "Request in progress",
	CodeKeyRetry:            "Retry the request",
	CodeUnauthenticated:     "Unauthenticated",
	CodePrincipalInvalid:    "Invalid principal",
	CodeBodyTooLarge:        "Request body too large",
	CodeBodyUnreadable:      "Request body unreadable",
	CodeLedgerUnavailable:   "Idempotency ledger unavailable",
	CodeLedgerMisconfigured: "Idempotency ledger misconfigured",
	CodeBudgetExhausted:     "Idempotency ledger budget exhausted",
	CodeLedgerBusy:          "Idempotency ledger busy",
	CodeRecordUnreadable:    "Stored response unreadable",
	CodeMutationAbandoned:   "Mutation not committed",
}

// problem is a's RFC 9457 problem details, with the spec's "error" member
// beside them.
func problem(a answer) map[string]any {
	title := problemTitles[a.code]
	if title == "" {
		title = http.StatusText(a.status)
	}
	return map[string]any{"type": ProblemTypeBase + a.code, "title": title, "status": a.status, "detail": a.message, "error": a.code}
}
