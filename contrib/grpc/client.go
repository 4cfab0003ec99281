package idemgrpc

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/d1idem/d1idem/idemclient"
)

// ClientOptions configures UnaryClientInterceptor. The zero value retries
// every unary method with idemclient's default Policy.
type ClientOptions struct {
	// Policy says when to retry, as for idemclient.Transport.
	Policy idemclient.Policy
	// Methods reports whether a method, by its full name, is guarded (given
	// a key and retried); nil guards every unary method.
	Methods func(fullMethod string) bool
}

// UnaryClientInterceptor returns an interceptor that gives each guarded
// call an idempotency key (a new one, from idemclient.NewKey, unless the
// outgoing metadata has one), keeps it across its retries, and retries as
// idemclient.Transport does over HTTP: Unavailable, ResourceExhausted and
// Aborted (a d1idem server's in-progress answer among them) no sooner than
// the server's RetryInfo, backing off (and DeadlineExceeded, the server's
// own, while the call's context lasts); Internal, Unknown and DataLoss only
// with Policy.RetryServerErrors, and never d1idem's final Internal answers;
// any other answer is returned as it is. Giving up is an
// *idemclient.UnknownOutcomeError carrying the key, to retry with later. An
// idemclient.Report in the call's context (idemclient.WithReport) is filled
// in. It fails at once if the Policy is invalid.
func UnaryClientInterceptor(opts ClientOptions) (grpc.UnaryClientInterceptor, error) {
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if opts.Methods != nil && !opts.Methods(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		return retry(ctx, opts.Policy, method, func(ctx context.Context, header *metadata.MD) error {
			return invoker(ctx, method, req, reply, cc, append(callOpts, grpc.Header(header))...)
		})
	}, nil
}

// retry makes the attempts of one call.
func retry(ctx context.Context, p idemclient.Policy, method string, attempt func(context.Context, *metadata.MD) error) error {
	key := ""
	if keys := metadata.ValueFromOutgoingContext(ctx, MetadataKey); len(keys) > 0 {
		key = keys[0]
	} else {
		key = idemclient.NewKey()
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	report, _ := idemclient.ReportFrom(ctx)
	start := time.Now()
	for n := 1; ; n++ {
		var header metadata.MD
		err := attempt(ctx, &header)
		if report != nil {
			replayed := header.Get(MetadataReplayed)
			report.Key, report.Attempts, report.Replayed = key, n, len(replayed) > 0 && replayed[0] == "true"
		}
		o, reason := classify(err)
		if err != nil && ctx.Err() != nil { // the call's own deadline or cancellation: the server may have run it
			return &idemclient.UnknownOutcomeError{Key: key, Attempts: n, LastCode: reason, Err: err, Stop: ctx.Err()}
		}
		if o.Class == idemclient.Final || o.Class == idemclient.Reused {
			return err
		}
		wait, stop := p.Wait(n, time.Since(start), o)
		if errors.Is(stop, idemclient.ErrNotRetried) {
			return err
		}
		if stop == nil {
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
				stop = context.DeadlineExceeded
			}
		}
		if stop == nil {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				stop = ctx.Err()
			case <-t.C:
				if report != nil {
					report.Waited += wait
				}
				continue
			}
		}
		return &idemclient.UnknownOutcomeError{Key: key, Attempts: n, LastCode: reason, RetryAfter: o.RetryAfter, Err: err, Stop: stop}
	}
}

// classify sorts an attempt's error into idemclient's classes, with the
// server's hint and, for a d1idem refusal, its reason.
func classify(err error) (idemclient.Outcome, string) {
	if err == nil {
		return idemclient.Outcome{Class: idemclient.Final}, ""
	}
	st := status.Convert(err)
	var o idemclient.Outcome
	reason := ""
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			o.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	switch {
	case reason == idemclient.CodeKeyReused:
		o.Class = idemclient.Reused
	case reason == idemclient.CodeKeyInProgress:
		o.Class = idemclient.InProgress
	case reason == idemclient.CodeKeyRetry:
		o.Class = idemclient.RetryNow
	case st.Code() == codes.Unavailable, st.Code() == codes.ResourceExhausted, st.Code() == codes.Aborted, st.Code() == codes.DeadlineExceeded:
		o.Class = idemclient.Unavailable
	case reason != "": // d1idem's other refusals are final
		o.Class = idemclient.Final
	case st.Code() == codes.Internal, st.Code() == codes.Unknown, st.Code() == codes.DataLoss:
		o.Class = idemclient.ServerError
	default:
		o.Class = idemclient.Final
	}
	return o, reason
}
