//go:build !unix

package cli

import "os/exec"

// inOwnGroup does nothing here: process groups are a Unix notion.
func inOwnGroup(*exec.Cmd) {}

// stopGroup kills cmd's process: there is no gentler way to stop it here.
func stopGroup(cmd *exec.Cmd, _ bool) error { return cmd.Process.Kill() }
