package cli

import "github.com/urfave/cli/v2"

// schemaCommand is being written; see the CLI issue.
func schemaCommand() *cli.Command { return &cli.Command{Name: "schema", Hidden: true} }
