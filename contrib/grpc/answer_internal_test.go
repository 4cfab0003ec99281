package idemgrpc

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idemclient"
)

// The ledger's refusals that name no key map to the status a gRPC client
// retries (or not) as the HTTP answers do: out of budget, shed for
// overload, unreachable.
func TestAnswerErrorLedgerRefusals(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{fmt.Errorf("idem: claim: %w", d1client.ErrBudget), codes.ResourceExhausted, idemclient.CodeBudgetExhausted},
		{fmt.Errorf("idem: claim: %w", d1client.ErrShed), codes.Unavailable, idemclient.CodeLedgerBusy},
		{fmt.Errorf("idem: claim: %w", errors.New("connection refused")), codes.Unavailable, idemclient.CodeLedgerUnavailable},
	} {
		st := status.Convert((&server{}).answerError(tc.err))
		var reason string
		var retry bool
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				reason = d.Reason
			case *errdetails.RetryInfo:
				retry = d.RetryDelay.AsDuration() > 0
			}
		}
		if st.Code() != tc.code || reason != tc.reason || !retry {
			t.Errorf("%v: answered %v %q (retry info %v), want %v %q with a retry delay", tc.err, st.Code(), reason, retry, tc.code, tc.reason)
		}
	}
}
