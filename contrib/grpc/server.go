// Package idemgrpc guards gRPC unary methods with a d1idem ledger, and gives
// gRPC clients the client half of the protocol: a server interceptor that
// runs each call's handler once per (principal, idempotency key) and
// replays its answer to every retry, and a client interceptor that makes
// the key, keeps it across its retries and waits as the server says.
//
// The server interceptor is idem.Ledger.Do with the handler as the
// function: the request (its method and deterministic protobuf encoding)
// is the job's payload, and the response message, or an error the options
// call final, is its stored result. It is a module of its own, so that the
// core module never requires gRPC.
package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idemclient"
)

// Metadata keys: the call's idempotency key (the HTTP header's name, in
// gRPC's lower case), and the mark of a replayed answer in the response's
// header metadata.
const (
	MetadataKey      = "idempotency-key"
	MetadataReplayed = "idempotent-replayed"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that the
// server interceptor's own refusals carry; its reason is one of package
// idemclient's Code* codes (idemclient.CodeKeyInProgress, ...). Refusals
// a client may retry carry a google.rpc.RetryInfo detail too.
const ErrorDomain = "d1idem"

// ServerOptions configures UnaryServerInterceptor. The zero value of every
// field but Principal means its default.
type ServerOptions struct {
	// Principal derives the authenticated caller from the call's context
	// (what an authentication interceptor before this one put there, the
	// peer's certificate), never from metadata the client chooses. An error
	// or "" answers Unauthenticated. Required.
	Principal func(ctx context.Context) (string, error)
	// Methods reports whether a method, by its full name
	// ("/shop.Orders/Create"), is guarded; nil guards every unary method.
	Methods func(fullMethod string) bool
	// KeyOptional lets calls without an idempotency key through,
	// unprotected, instead of answering InvalidArgument.
	KeyOptional bool
	// Final reports whether a handler's error is the call's final answer:
	// stored, and replayed to every retry with its code, message and
	// details. Any other error releases the key, so that a retry runs the
	// handler again. nil means DefaultFinal.
	Final func(error) bool
}

// DefaultFinal calls an error final when its code says a retry of the same
// call would fail the same way: InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition, OutOfRange, Unimplemented.
func DefaultFinal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		return true
	}
	return false
}

type server struct {
	l *idem.Ledger
	o ServerOptions
}

// UnaryServerInterceptor returns an interceptor that runs each guarded
// call's handler at most once per (principal, key), with the key from the
// call's "idempotency-key" metadata, and answers every retry with the first
// call's response (marked "idempotent-replayed: true" in the header
// metadata) or final error. What it answers itself:
//
//   - InvalidArgument: no key (idempotency_key_required), or not 1-255
//     printable ASCII characters, or two (idempotency_key_invalid);
//   - Unauthenticated: Principal failed or returned "";
//   - FailedPrecondition: the key was used for another request
//     (idempotency_key_reused);
//   - Aborted, with RetryInfo: the key's first call is still running
//     (idempotency_key_in_progress), or this call's run was superseded by a
//     takeover (idempotency_key_retry: a retry gets the stored answer);
//   - Unavailable or ResourceExhausted, with RetryInfo: the ledger could not
//     be reached, or its API budget is spent; nothing ran;
//   - Internal: the ledger is misconfigured, the stored answer cannot be
//     read, or the response was too large to store (it ran once).
//
// The handler's context carries the run (RunFromContext): D1 statements it
// adds commit with the stored answer, once per key. The handler runs under
// the call's context: if the client goes away and the handler returns the
// context's error, the key is released and a retry runs it again.
func UnaryServerInterceptor(l *idem.Ledger, opts ServerOptions) (grpc.UnaryServerInterceptor, error) {
	if l == nil {
		return nil, errors.New("idemgrpc: UnaryServerInterceptor needs a Ledger")
	}
	if opts.Principal == nil {
		return nil, errors.New("idemgrpc: ServerOptions.Principal is required: derive the principal from authentication")
	}
	if opts.Final == nil {
		opts.Final = DefaultFinal
	}
	s := &server{l: l, o: opts}
	return s.intercept, nil
}

type runKey struct{}

// RunFromContext returns the run of the call the interceptor executes: its
// generation, and Run.Add to commit D1 statements with the call's answer.
func RunFromContext(ctx context.Context) (*idem.Run, bool) {
	r, ok := ctx.Value(runKey{}).(*idem.Run)
	return r, ok
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.o.Methods != nil && !s.o.Methods(info.FullMethod) {
		return handler(ctx, req)
	}
	keys := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch {
	case len(keys) == 0 && s.o.KeyOptional:
		return handler(ctx, req)
	case len(keys) == 0:
		return nil, refusal(codes.InvalidArgument, idemclient.CodeKeyRequired, "this method requires an idempotency-key metadata entry", 0)
	case len(keys) > 1:
		return nil, refusal(codes.InvalidArgument, idemclient.CodeKeyInvalid, "send exactly one idempotency-key", 0)
	case !idem.ValidKey(keys[0]):
		return nil, refusal(codes.InvalidArgument, idemclient.CodeKeyInvalid, "the idempotency key must be 1-255 printable ASCII characters", 0)
	}
	principal, err := s.o.Principal(ctx)
	if err != nil || principal == "" {
		return nil, refusal(codes.Unauthenticated, idemclient.CodeUnauthenticated, "the call could not be authenticated", 0)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s is a %T, not a protobuf message", info.FullMethod, req)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: encoding the request: %v", err)
	}
	var fresh any  // the handler's own response, when it ran now
	var herr error // and its own error
	job := idem.Job{Principal: principal, Key: keys[0], Payload: append([]byte(info.FullMethod+"\n"), body...)}
	res, err := s.l.Do(ctx, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
		resp, err := handler(context.WithValue(ctx, runKey{}, run), req)
		if err != nil {
			if herr = err; !s.o.Final(err) {
				return nil, err
			}
			return encodeError(err)
		}
		fresh = resp
		return encodeResponse(resp)
	})
	switch {
	case err != nil && herr != nil && errors.Is(err, herr):
		return nil, herr // not final: the key was released; or final, as the first answer
	case err != nil:
		return nil, s.answerError(err)
	}
	if res.Replayed {
		_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
	} else if fresh != nil {
		return fresh, nil
	}
	return decode(res.Value)
}

// The first byte of a stored answer: a response message, or a final error.
const (
	kindResponse = 'm'
	kindError    = 'e'
)

// encodeResponse stores a response as its message's full name and its
// deterministic encoding, so a replay needs no knowledge of the method.
func encodeResponse(resp any) ([]byte, error) {
	m, ok := resp.(proto.Message)
	if !ok {
		return nil, idem.Final(status.Errorf(codes.Internal, "idemgrpc: the response is a %T, not a protobuf message", resp))
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, idem.Final(status.Errorf(codes.Internal, "idemgrpc: encoding the response: %v", err))
	}
	name := m.ProtoReflect().Descriptor().FullName()
	return append(append([]byte{kindResponse}, name+"\n"...), b...), nil
}

// encodeError stores a final error as its google.rpc.Status.
func encodeError(err error) ([]byte, error) {
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		return nil, idem.Final(status.Errorf(codes.Internal, "idemgrpc: encoding the error: %v", merr))
	}
	return append([]byte{kindError}, b...), nil
}

// decode rebuilds a stored answer.
func decode(v []byte) (any, error) {
	unreadable := func(why string, args ...any) error {
		return refusal(codes.Internal, idemclient.CodeRecordUnreadable, "the stored answer cannot be read: "+fmt.Sprintf(why, args...), 0)
	}
	if len(v) == 0 {
		return nil, unreadable("empty")
	}
	switch v[0] {
	case kindResponse:
		name, data, ok := strings.Cut(string(v[1:]), "\n")
		if !ok {
			return nil, unreadable("no message name")
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			return nil, unreadable("message %s: %v", name, err)
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal([]byte(data), m); err != nil {
			return nil, unreadable("message %s: %v", name, err)
		}
		return m, nil
	case kindError:
		st := new(spb.Status)
		if err := proto.Unmarshal(v[1:], st); err != nil {
			return nil, unreadable("status: %v", err)
		}
		return nil, status.ErrorProto(st)
	}
	return nil, unreadable("kind %q", v[0])
}

// answerError maps Do's errors (not the handler's own) to a status.
func (s *server) answerError(err error) error {
	var busy *idem.InProgressError
	var derr *d1client.Error
	switch {
	case errors.As(err, &busy):
		return refusal(codes.Aborted, idemclient.CodeKeyInProgress, "a call with this idempotency key is still being processed; retry after the RetryInfo delay", busy.RetryAfter)
	case errors.Is(err, idem.ErrKeyReused):
		return refusal(codes.FailedPrecondition, idemclient.CodeKeyReused, "this idempotency key was already used for a different request", 0)
	case errors.Is(err, idem.ErrFencedOut):
		return refusal(codes.Aborted, idemclient.CodeKeyRetry, "this call was superseded by a retry; retry it for the stored answer", time.Millisecond)
	case errors.Is(err, idem.ErrResultNotStored):
		return refusal(codes.Internal, idemclient.CodeRecordUnreadable, "the first call ran, but its response was over the stored-body cap and cannot be replayed", 0)
	case errors.Is(err, idem.ErrUnreadableRecord):
		return refusal(codes.Internal, idemclient.CodeRecordUnreadable, "the stored answer cannot be read", 0)
	case errors.As(err, new(*idem.FinalError)):
		return err // a response that could not be encoded
	case errors.Is(err, idem.ErrTxNotCommitted) && (errors.Is(err, d1client.ErrSQL) || errors.Is(err, d1client.ErrInvalid)):
		return refusal(codes.Internal, idemclient.CodeMutationAbandoned, "the call's statements failed and were not committed", 0)
	case errors.Is(err, idem.ErrTxNotCommitted):
		return refusal(codes.Unavailable, idemclient.CodeMutationAbandoned, "the call's statements could not be committed; retry", time.Second)
	case idem.Permanent(err):
		return refusal(codes.Internal, idemclient.CodeLedgerMisconfigured, "the idempotency ledger is misconfigured; the server's operators must fix it", 0)
	}
	wait := time.Second
	if errors.As(err, &derr) && derr.RetryAfter > 0 {
		wait = derr.RetryAfter
	}
	if errors.Is(err, d1client.ErrBudget) || errors.Is(err, d1client.ErrRateLimited) {
		return refusal(codes.ResourceExhausted, idemclient.CodeBudgetExhausted, "the idempotency ledger's request budget is spent; retry later", wait)
	}
	if errors.Is(err, d1client.ErrShed) {
		return refusal(codes.Unavailable, idemclient.CodeLedgerBusy, "the idempotency ledger has more calls waiting than it can answer in time; retry later", wait)
	}
	return refusal(codes.Unavailable, idemclient.CodeLedgerUnavailable, "the idempotency ledger is unavailable; retry later", wait)
}

// refusal is a status with an ErrorInfo of ErrorDomain and reason, and,
// if retryAfter is positive, a RetryInfo.
func refusal(c codes.Code, reason, msg string, retryAfter time.Duration) error {
	st := status.New(c, reason+": "+msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: reason}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
