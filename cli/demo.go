package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/metric"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/d1local"
	"github.com/d1idem/d1idem/examples/orders/ordersdemo"
	"github.com/d1idem/d1idem/internal/human"
	"github.com/d1idem/d1idem/internal/textsafe"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:        "demo",
		Usage:       "show what Idempotency-Key protection does, on a small orders API and the embedded d1local",
		Description: help("demo"),
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "ttl", Value: 2 * time.Second, Usage: "hold a pending key for `TTL` without an update, shortened for the demo (30s in production): 500ms to 5m"},
			&cli.StringFlag{Name: "dir", Usage: "keep the demo's database under `DIR` (" + d1local.LocalDir + " is where the example API and the CLI's --local look); default: in memory"},
			&cli.BoolFlag{Name: "metrics", Usage: "end with a summary of the OpenTelemetry metrics the story produced: requests by outcome, D1 calls, completions, leases", DisableDefaultText: true},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			switch ttl := c.Duration("ttl"); {
			case ttl < 500*time.Millisecond:
				return usagef("--ttl %v is too short for the story; use at least 500ms", ttl)
			case ttl > ordersdemo.MaxTTL:
				return usagef("--ttl %v is too long for the story, which waits it out three times; use at most %v", ttl, ordersdemo.MaxTTL)
			}
			return runDemo(c.Context, c.App.Writer, demoOptions{ttl: c.Duration("ttl"), dir: c.String("dir"), metrics: c.Bool("metrics")}, ordersdemo.API)
		},
	}
}

// demoOptions are the demo's flags.
type demoOptions struct {
	ttl     time.Duration
	dir     string // keep the database here; "" in memory
	metrics bool   // sum up the story's metrics
}

// runDemo plays the story on d1local (in memory, or under opts.dir)
// against the API newAPI makes, and writes it to out; a promise that did
// not hold is an error.
func runDemo(ctx context.Context, out io.Writer, opts demoOptions, newAPI ordersdemo.NewAPI) error {
	var mp metric.MeterProvider
	var m *ordersdemo.Metrics
	if opts.metrics {
		m = ordersdemo.NewMetrics()
		defer m.Provider.Shutdown(context.Background())
		mp = m.Provider
	}
	fmt.Fprintln(out, "d1idem demo: what Idempotency-Key protection does. Starting a local D1 (the embedded d1local)")
	fmt.Fprintln(out, "and a small orders API on it, then playing a client against the API, one step at a time.")
	d1, err := d1local.Listen(d1local.Config{Dir: opts.dir}, "")
	if err != nil {
		return err
	}
	defer d1.Close()
	db, err := localClient(d1, d1local.LocalDatabaseID, func(c *d1client.Config) { c.MeterProvider = mp })
	if err != nil {
		return err
	}
	api, err := ordersdemo.Serve(ctx, db, opts.ttl, mp, newAPI)
	if err != nil {
		return err
	}
	defer api.Close()
	where := "in memory (--dir DIR keeps it)"
	if opts.dir != "" {
		where = fmt.Sprintf("database %q kept under %s", d1local.LocalDatabaseID, opts.dir)
	}
	fmt.Fprintf(out, "\nThe orders API is at %s. Its ledger, the idempotency_keys table, is in D1: here the\n", api.URL)
	fmt.Fprintf(out, "embedded d1local, %s.\n", where)
	fmt.Fprintf(out, "A key whose request is running is held for %s without an update (the TTL; 30s in production).\n\n", human.Duration(opts.ttl))
	s := ordersdemo.New(ordersdemo.Config{BaseURL: api.URL, DB: db, Ledger: api.Ledger, StallHeader: ordersdemo.StallHeader, Out: out})
	if err := s.Play(ctx); err != nil {
		return err
	}
	if err := s.Report(ctx); err != nil {
		return err
	}
	if m != nil {
		if err := m.WriteSummary(ctx, out); err != nil {
			return err
		}
	}
	if broken := s.Broken(); len(broken) > 0 {
		return fmt.Errorf("%s broken: %s", human.Plural(int64(len(broken)), "promise", "promises"), strings.Join(broken, "; "))
	}
	return renderNextSteps(out, opts.dir)
}

// renderNextSteps is the demo's last screen: where its database is kept,
// then the story's next steps.
func renderNextSteps(w io.Writer, dir string) error {
	fmt.Fprintln(w, "\nEvery promise held.")
	if dir != "" {
		fmt.Fprintf(w, "\nThe demo's database is kept under %s. Look at its rows:\n  go run ./cmd/d1idem keys list --local %s\n", dir, textsafe.ShellQuote(dir))
	}
	return ordersdemo.WriteNextSteps(w, textsafe.ShellQuote(cmp.Or(dir, d1local.LocalDir)))
}
