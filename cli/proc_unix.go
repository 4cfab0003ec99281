//go:build unix

package cli

import (
	"os/exec"
	"syscall"
)

// inOwnGroup makes cmd start in a process group of its own, so that the
// processes it starts (wrangler dev's workerd) stop with it, and a Ctrl-C
// at the terminal reaches this program alone, which then stops them.
func inOwnGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// stopGroup sends the process group of cmd SIGTERM, or SIGKILL with kill.
func stopGroup(cmd *exec.Cmd, kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	return syscall.Kill(-cmd.Process.Pid, sig)
}
