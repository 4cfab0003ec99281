package cli

import "github.com/urfave/cli/v2"

// keysCommand is being written; see the CLI issue.
func keysCommand() *cli.Command { return &cli.Command{Name: "keys", Hidden: true} }
