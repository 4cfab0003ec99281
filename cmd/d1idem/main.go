// Command d1idem is the d1idem admin command line; see package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/d1idem/d1idem/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
