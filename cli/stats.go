package cli

import "github.com/urfave/cli/v2"

// statsCommand is being written; see the CLI issue.
func statsCommand() *cli.Command { return &cli.Command{Name: "stats", Hidden: true} }
