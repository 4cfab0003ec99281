package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/d1idem/d1idem/contrib/grpc"
	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idemclient"
)

// orders is the service under test: /shop.Orders/Create takes and returns
// a google.protobuf.Struct, so that the tests need no generated code. It
// counts its runs by order name, and can be told how to answer.
type orders struct {
	runs   sync.Map // order name -> *atomic.Int64
	answer func(ctx context.Context, name string, n int64) (*structpb.Struct, error)
}

const createMethod = "/shop.Orders/Create"

func (o *orders) create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	name := in.GetFields()["name"].GetStringValue()
	c, _ := o.runs.LoadOrStore(name, new(atomic.Int64))
	n := c.(*atomic.Int64).Add(1)
	if o.answer != nil {
		return o.answer(ctx, name, n)
	}
	return structpb.NewStruct(map[string]any{"order": name, "run": float64(n)})
}

func (o *orders) count(name string) int64 {
	if c, ok := o.runs.Load(name); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

var ordersDesc = grpc.ServiceDesc{
	ServiceName: "shop.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return srv.(*orders).create(ctx, req.(*structpb.Struct))
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: createMethod}, h)
	}}},
}

// env is a gRPC server guarded by the interceptor, on a ledger on d1local,
// reached in memory.
type env struct {
	d1     *d1localtest.Server
	ledger *idem.Ledger
	svc    *orders
	lis    *bufconn.Listener
}

func newEnv(t *testing.T, cfg idem.Config, opts idemgrpc.ServerOptions) *env {
	t.Helper()
	d1 := d1localtest.New(t, d1localtest.WithSchema())
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = -1
	}
	ledger, err := idem.New(d1.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Principal == nil {
		opts.Principal = principalFromMetadata
	}
	icpt, err := idemgrpc.UnaryServerInterceptor(ledger, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{d1: d1, ledger: ledger, svc: &orders{}, lis: bufconn.Listen(1 << 20)}
	srv := grpc.NewServer(grpc.UnaryInterceptor(icpt))
	srv.RegisterService(&ordersDesc, e.svc)
	go srv.Serve(e.lis)
	t.Cleanup(srv.Stop)
	return e
}

// principalFromMetadata stands in for authentication: the test's callers
// name their account.
func principalFromMetadata(ctx context.Context) (string, error) {
	if v := metadata.ValueFromIncomingContext(ctx, "x-account"); len(v) == 1 {
		return v[0], nil
	}
	return "", errors.New("no account")
}

func (e *env) conn(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return e.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// call sends Create for the order name with the key (none if ""), as acct_1.
func call(cc *grpc.ClientConn, key, name string, extra ...string) (*structpb.Struct, metadata.MD, error) {
	md := []string{"x-account", "acct_1"}
	if key != "" {
		md = append(md, idemgrpc.MetadataKey, key)
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), append(md, extra...)...), time.Minute)
	defer cancel()
	in, _ := structpb.NewStruct(map[string]any{"name": name})
	out := new(structpb.Struct)
	var header metadata.MD
	err := cc.Invoke(ctx, createMethod, in, out, grpc.Header(&header))
	return out, header, err
}

// reason is the d1idem ErrorInfo reason of err, and its RetryInfo delay.
func reason(err error) (string, time.Duration) {
	var r string
	var d time.Duration
	for _, det := range status.Convert(err).Details() {
		switch det := det.(type) {
		case *errdetails.ErrorInfo:
			if det.GetDomain() == idemgrpc.ErrorDomain {
				r = det.GetReason()
			}
		case *errdetails.RetryInfo:
			d = det.GetRetryDelay().AsDuration()
		}
	}
	return r, d
}

// The net/http suite's scenarios, over gRPC: first execution, replay,
// reuse, in progress, a missing or invalid key, no principal, and a
// response over the stored-body cap.
func TestServerScenarios(t *testing.T) {
	e := newEnv(t, idem.Config{MaxStoredBody: 2048}, idemgrpc.ServerOptions{})
	cc := e.conn(t)

	first, h, err := call(cc, "k1", "tea")
	if err != nil || first.GetFields()["run"].GetNumberValue() != 1 || len(h.Get(idemgrpc.MetadataReplayed)) != 0 {
		t.Fatalf("first execution: %v %v %v", first, h, err)
	}
	for range 2 {
		again, h, err := call(cc, "k1", "tea")
		if err != nil || !proto.Equal(again, first) || h.Get(idemgrpc.MetadataReplayed)[0] != "true" {
			t.Fatalf("replay: %v %v %v", again, h, err)
		}
	}
	if n := e.svc.count("tea"); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}

	_, _, err = call(cc, "k1", "coffee")
	if r, _ := reason(err); status.Code(err) != codes.FailedPrecondition || r != idemclient.CodeKeyReused || e.svc.count("coffee") != 0 {
		t.Errorf("reuse: %v", err)
	}
	_, _, err = call(cc, "", "tea")
	if r, _ := reason(err); status.Code(err) != codes.InvalidArgument || r != idemclient.CodeKeyRequired {
		t.Errorf("no key: %v", err)
	}
	_, _, err = call(cc, strings.Repeat("k", 256), "tea")
	if r, _ := reason(err); status.Code(err) != codes.InvalidArgument || r != idemclient.CodeKeyInvalid {
		t.Errorf("an invalid key: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, "k9")
	err = cc.Invoke(ctx, createMethod, &structpb.Struct{}, new(structpb.Struct))
	if r, _ := reason(err); status.Code(err) != codes.Unauthenticated || r != idemclient.CodeUnauthenticated {
		t.Errorf("no principal: %v", err)
	}

	// In progress: the first call's handler is still running.
	release := make(chan struct{})
	e.svc.answer = func(ctx context.Context, name string, n int64) (*structpb.Struct, error) {
		if name == "slow" {
			<-release
		}
		if name == "big" {
			return structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", 4096)})
		}
		return structpb.NewStruct(map[string]any{"order": name})
	}
	done := make(chan error, 1)
	go func() { _, _, err := call(cc, "k2", "slow"); done <- err }()
	for e.svc.count("slow") == 0 {
		time.Sleep(time.Millisecond)
	}
	_, _, err = call(cc, "k2", "slow")
	if r, wait := reason(err); status.Code(err) != codes.Aborted || r != idemclient.CodeKeyInProgress || wait <= 0 {
		t.Errorf("in progress: %v (retry after %v)", err, wait)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Over the cap: it ran once, and neither the first call nor a retry gets
	// a response that could not be stored.
	for range 2 {
		_, _, err = call(cc, "k3", "big")
		if r, _ := reason(err); status.Code(err) != codes.Internal || r != idemclient.CodeRecordUnreadable {
			t.Errorf("over the stored-body cap: %v", err)
		}
	}
	if n := e.svc.count("big"); n != 1 {
		t.Errorf("the big order ran %d times", n)
	}
}

// A final error (by DefaultFinal, its code) is stored and replayed with
// its code and message; any other releases the key, so a retry runs again.
func TestServerErrors(t *testing.T) {
	e := newEnv(t, idem.Config{}, idemgrpc.ServerOptions{})
	cc := e.conn(t)
	e.svc.answer = func(ctx context.Context, name string, n int64) (*structpb.Struct, error) {
		switch {
		case name == "unknown-sku":
			return nil, status.Error(codes.InvalidArgument, "no such sku")
		case name == "flaky" && n == 1:
			return nil, status.Error(codes.Unavailable, "the warehouse timed out")
		case name == "plain" && n == 1:
			return nil, errors.New("a plain error")
		}
		return structpb.NewStruct(map[string]any{"order": name, "run": float64(n)})
	}
	for i := range 3 {
		_, h, err := call(cc, "final", "unknown-sku")
		if s := status.Convert(err); s.Code() != codes.InvalidArgument || s.Message() != "no such sku" || (i > 0) != (len(h.Get(idemgrpc.MetadataReplayed)) > 0) {
			t.Fatalf("call %d: %v %v", i, err, h)
		}
	}
	if n := e.svc.count("unknown-sku"); n != 1 {
		t.Errorf("the final error's handler ran %d times", n)
	}
	for _, name := range []string{"flaky", "plain"} {
		_, _, err := call(cc, name, name)
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		if r, _ := reason(err); r != "" {
			t.Errorf("%s: the handler's error carries d1idem's ErrorInfo: %v", name, err)
		}
		out, _, err := call(cc, name, name)
		if err != nil || out.GetFields()["run"].GetNumberValue() != 2 {
			t.Errorf("%s, retried: %v %v, want a second run", name, out, err)
		}
	}
}

// The handler's D1 statements commit with its answer, once per key.
func TestServerRunStatements(t *testing.T) {
	e := newEnv(t, idem.Config{}, idemgrpc.ServerOptions{})
	if _, err := e.d1.Client.Query(context.Background(), "CREATE TABLE orders (name TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	e.svc.answer = func(ctx context.Context, name string, n int64) (*structpb.Struct, error) {
		run, ok := idemgrpc.RunFromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no run")
		}
		if err := run.Add(d1client.Statement{SQL: "INSERT INTO orders (name) VALUES (?)", Params: []any{name}}); err != nil {
			return nil, err
		}
		return structpb.NewStruct(map[string]any{"order": name})
	}
	cc := e.conn(t)
	for range 3 {
		if _, _, err := call(cc, "tx", "tea"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := e.d1.Client.Query(context.Background(), "SELECT count(*) FROM orders")
	if err != nil || res.Rows[0][0] != d1client.IntValue(1) {
		t.Errorf("orders: %v %v, want 1", res, err)
	}
}

// Many concurrent calls with one key run the handler once.
func TestServerConcurrentCalls(t *testing.T) {
	e := newEnv(t, idem.Config{}, idemgrpc.ServerOptions{})
	cc := e.conn(t)
	var wg sync.WaitGroup
	var ok, busy atomic.Int64
	for range 32 {
		wg.Go(func() {
			out, _, err := call(cc, "same", "tea")
			switch r, _ := reason(err); {
			case err == nil && out.GetFields()["run"].GetNumberValue() == 1:
				ok.Add(1)
			case r == idemclient.CodeKeyInProgress:
				busy.Add(1)
			default:
				t.Errorf("%v %v", out, err)
			}
		})
	}
	wg.Wait()
	if n := e.svc.count("tea"); n != 1 || ok.Load()+busy.Load() != 32 {
		t.Errorf("ran %d times; %d answered, %d in progress", n, ok.Load(), busy.Load())
	}
}

// End to end with the client interceptor: D1 answers lost after commit,
// D1 5xx, the gRPC answer lost after the server stored it, and a dead
// owner's pending row. Each logical call's handler runs once, and its
// client gets the first answer.
func TestClientEndToEndWithFaults(t *testing.T) {
	const ttl = 300 * time.Millisecond
	e := newEnv(t, idem.Config{TTL: ttl, MaxLease: ttl}, idemgrpc.ServerOptions{})
	var dropped sync.Map // keys whose first good answer the network loses
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil || !strings.HasPrefix(req.(*structpb.Struct).GetFields()["name"].GetStringValue(), "lost") {
			return err
		}
		key := metadata.ValueFromOutgoingContext(ctx, idemgrpc.MetadataKey)[0]
		if _, loaded := dropped.LoadOrStore(key, true); !loaded {
			return status.Error(codes.Unavailable, "the connection dropped before the answer")
		}
		return nil
	}
	client, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{Policy: idemclient.Policy{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	cc := e.conn(t, grpc.WithChainUnaryInterceptor(client, lose))

	// A dead owner: another replica claimed "dead-0" and went silent (no
	// heartbeats, never answers), as a killed process leaves its row.
	deadIn, _ := structpb.NewStruct(map[string]any{"name": "dead-0"})
	body, _ := proto.MarshalOptions{Deterministic: true}.Marshal(deadIn)
	replica, err := idem.New(e.d1.Client, idem.Config{TTL: ttl, MaxLease: ttl, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	claimed, killed := make(chan struct{}), make(chan struct{})
	defer close(killed)
	go replica.Do(context.Background(), idem.Job{Principal: "acct_1", Key: "key-dead-0", Payload: append([]byte(createMethod+"\n"), body...)},
		func(context.Context, *idem.Run) ([]byte, error) {
			close(claimed)
			<-killed
			return nil, errors.New("killed")
		})
	<-claimed
	e.d1.D1.Inject(d1local.Fault{LoseResponse: true}, d1local.Fault{}, d1local.Fault{Internal: true, AfterCommit: true},
		d1local.Fault{BadGateway: true}, d1local.Fault{LoseResponse: true})

	names := []string{"dead-0", "lost-1", "lost-2", "plain-3", "plain-4", "plain-5", "plain-6", "plain-7"}
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			var report idemclient.Report
			ctx := metadata.AppendToOutgoingContext(idemclient.WithReport(context.Background(), &report), "x-account", "acct_1", idemgrpc.MetadataKey, "key-"+name)
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			in, _ := structpb.NewStruct(map[string]any{"name": name})
			out := new(structpb.Struct)
			if err := cc.Invoke(ctx, createMethod, in, out); err != nil {
				t.Errorf("%s: %v (report %+v)", name, err, report)
				return
			}
			if out.GetFields()["order"].GetStringValue() != name || out.GetFields()["run"].GetNumberValue() != 1 {
				t.Errorf("%s: answer %v, want the first run's", name, out)
			}
			if strings.HasPrefix(name, "lost") && !report.Replayed {
				t.Errorf("%s: the answer after a lost one is not a replay: %+v", name, report)
			}
		})
	}
	wg.Wait()
	for _, name := range names {
		if n := e.svc.count(name); n != 1 {
			t.Errorf("%s ran %d times", name, n)
		}
	}
}

// A call with no key gets one; a call the caller keyed keeps it; giving
// up says the outcome is unknown and names the key.
func TestClientKeysAndGivingUp(t *testing.T) {
	e := newEnv(t, idem.Config{}, idemgrpc.ServerOptions{})
	var seen []string
	var mu sync.Mutex
	spy := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		seen = append(seen, metadata.ValueFromOutgoingContext(ctx, idemgrpc.MetadataKey)...)
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{Policy: idemclient.Policy{MaxAttempts: 3, InitialBackoff: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	cc := e.conn(t, grpc.WithChainUnaryInterceptor(client, spy))
	if _, _, err := call(cc, "", "auto"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := call(cc, "mine", "kept"); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || len(seen[0]) != 32 || seen[1] != "mine" {
		t.Errorf("keys sent: %q", seen)
	}
	e.svc.answer = func(context.Context, string, int64) (*structpb.Struct, error) {
		return nil, status.Error(codes.Unavailable, "down")
	}
	_, _, err = call(cc, "doomed", "x")
	var unknown *idemclient.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Key != "doomed" || unknown.Attempts != 3 || !strings.Contains(err.Error(), "outcome unknown") {
		t.Errorf("giving up: %v", err)
	}
	if _, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{Policy: idemclient.Policy{MaxAttempts: -1}}); err == nil {
		t.Error("an invalid policy was accepted")
	}
}

// A handler that panics never leaves its key pending: with a recovery
// interceptor outside this one, the panic releases the key and the retry
// runs; with one inside, the recovered error (Internal) is not final, so
// the key is released too.
func TestServerPanicReleasesKey(t *testing.T) {
	recovery := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(ctx, req)
	}
	for _, outside := range []bool{true, false} {
		t.Run(fmt.Sprintf("recovery outside %v", outside), func(t *testing.T) {
			d1 := d1localtest.New(t, d1localtest.WithSchema())
			ledger, err := idem.New(d1.Client, idem.Config{Heartbeat: -1})
			if err != nil {
				t.Fatal(err)
			}
			guard, err := idemgrpc.UnaryServerInterceptor(ledger, idemgrpc.ServerOptions{Principal: principalFromMetadata})
			if err != nil {
				t.Fatal(err)
			}
			chain := []grpc.UnaryServerInterceptor{recovery, guard}
			if !outside {
				chain = []grpc.UnaryServerInterceptor{guard, recovery}
			}
			svc := &orders{answer: func(ctx context.Context, name string, n int64) (*structpb.Struct, error) {
				if n == 1 {
					panic("the payment provider's client crashed")
				}
				return structpb.NewStruct(map[string]any{"order": name, "run": float64(n)})
			}}
			e := &env{d1: d1, ledger: ledger, svc: svc, lis: bufconn.Listen(1 << 20)}
			srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
			srv.RegisterService(&ordersDesc, svc)
			go srv.Serve(e.lis)
			t.Cleanup(srv.Stop)
			cc := e.conn(t)
			if _, _, err := call(cc, "k", "tea"); status.Code(err) != codes.Internal {
				t.Fatalf("the panicking call: %v", err)
			}
			out, _, err := call(cc, "k", "tea")
			if err != nil || out.GetFields()["run"].GetNumberValue() != 2 {
				t.Fatalf("the retry: %v %v, want a second run at once", out, err)
			}
		})
	}
}
