package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one control-plane program started by this package, with its output in a
// log file so that a failing test can show it.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once Wait returned
	waitErr error
}

// startProcess starts path with args (inside netns, when not ""), appending its output
// to logPath.
func startProcess(name, path string, args []string, logPath, netns string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	var cmd *exec.Cmd
	if netns != "" {
		// `ip netns exec` enters the namespace and then execs the program, so the PID
		// we hold is the program's own.
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group, and killed with the test binary should it die without cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process (by PID), waits up to grace for it to exit, then
// SIGKILLs it. It returns once the process is gone.
func (p *process) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// exitError describes why the process ended early, with the end of its log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited: %v\n%s", p.name, p.waitErr, tailFile(p.logPath, 30))
}

// tailFile returns the last n lines of a file, or why it could not be read.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log)"
		}
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
