package idemclient_test

import (
	"testing"

	"github.com/d1idem/d1idem/idem/idemhttp"
	"github.com/d1idem/d1idem/idemclient"
)

// The client's names of the protocol are the middleware's.
func TestNamesMatchMiddleware(t *testing.T) {
	for client, server := range map[string]string{
		idemclient.HeaderKey:             idemhttp.HeaderKey,
		idemclient.HeaderReplayed:        idemhttp.HeaderReplayed,
		idemclient.CodeKeyRequired:       idemhttp.CodeKeyRequired,
		idemclient.CodeKeyInvalid:        idemhttp.CodeKeyInvalid,
		idemclient.CodeKeyReused:         idemhttp.CodeKeyReused,
		idemclient.CodeKeyInProgress:     idemhttp.CodeKeyInProgress,
		idemclient.CodeKeyRetry:          idemhttp.CodeKeyRetry,
		idemclient.CodeUnauthenticated:   idemhttp.CodeUnauthenticated,
		idemclient.CodePrincipalInvalid:  idemhttp.CodePrincipalInvalid,
		idemclient.CodeBodyTooLarge:      idemhttp.CodeBodyTooLarge,
		idemclient.CodeBodyUnreadable:    idemhttp.CodeBodyUnreadable,
		idemclient.CodeLedgerUnavailable: idemhttp.CodeLedgerUnavailable,
		idemclient.CodeBudgetExhausted:   idemhttp.CodeBudgetExhausted,
		idemclient.CodeRecordUnreadable:  idemhttp.CodeRecordUnreadable,
		idemclient.CodeMutationAbandoned: idemhttp.CodeMutationAbandoned,
	} {
		if client != server {
			t.Errorf("idemclient has %q where idemhttp has %q", client, server)
		}
	}
}
