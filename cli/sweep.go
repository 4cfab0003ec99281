package cli

import "github.com/urfave/cli/v2"

// sweepCommand is being written; see the CLI issue.
func sweepCommand() *cli.Command { return &cli.Command{Name: "sweep", Hidden: true} }
