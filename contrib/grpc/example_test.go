package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/d1idem/d1idem/contrib/grpc"
	"github.com/d1idem/d1idem/d1local/d1localtest"
	"github.com/d1idem/d1idem/idem"
	"github.com/d1idem/d1idem/idemclient"
)

// A gRPC service guarded by the server interceptor, and a client whose
// interceptor makes the key and retries: the second call, with the same
// key (a retry after a lost answer), is answered from the ledger.
func ExampleUnaryServerInterceptor() {
	d1, err := d1localtest.Start(d1localtest.WithSchema()) // on Cloudflare: d1client.New(...)
	if err != nil {
		log.Fatal(err)
	}
	defer d1.Close()
	ledger, err := idem.New(d1.Client, idem.Config{})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idemgrpc.UnaryServerInterceptor(ledger, idemgrpc.ServerOptions{
		// The authenticated caller, as your authentication interceptor found it.
		Principal: func(ctx context.Context) (string, error) { return "acct_1", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	svc := &orders{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(guard))
	srv.RegisterService(&ordersDesc, svc) // your generated RegisterXxxServer
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	retrying, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientOptions{})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := grpc.NewClient("passthrough:///orders",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(retrying))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()

	in, _ := structpb.NewStruct(map[string]any{"name": "tea"})
	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, "order-tea-1")
	for range 2 {
		var report idemclient.Report
		out := new(structpb.Struct)
		if err := cc.Invoke(idemclient.WithReport(ctx, &report), createMethod, in, out); err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.GetFields()["order"].GetStringValue(), "replayed:", report.Replayed)
	}
	fmt.Println("runs:", svc.count("tea"))
	// Output:
	// tea replayed: false
	// tea replayed: true
	// runs: 1
}
