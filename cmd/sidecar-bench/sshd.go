package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// sshd is a throwaway OpenSSH server on loopback with its own host key, configuration and
// authorized key, and the client configuration that reaches it: host "bench" opens a
// fresh connection every time, host "bench-mux" shares one master connection.
type sshd struct {
	cmd        *exec.Cmd
	exited     chan struct{}
	dir        string
	clientConf string
	cipher     string
	cipherNote string
	madeRunDir bool
	maskedRC   string // the login shell's rc file hidden from sshd's sessions, if any
}

// startSSHD writes keys and configurations under dir/ssh and runs sshd -D -e on a free
// loopback port, returning once a command goes through it.
func startSSHD(ctx context.Context, log *slog.Logger, dir string) (*sshd, error) {
	bin, err := exec.LookPath("sshd")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/sshd"); err != nil {
			return nil, fmt.Errorf("sshd not found: apt-get install openssh-server openssh-client: %w", err)
		}
	}
	s := &sshd{dir: filepath.Join(dir, "ssh"), exited: make(chan struct{}), cipher: "aes128-gcm@openssh.com"}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return nil, err
	}
	for _, k := range []string{"host_ed25519", "id_ed25519"} {
		if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(s.dir, k)).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(s.dir, "id_ed25519.pub"))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(s.dir, "authorized_keys"), pub, 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	serverConf := filepath.Join(s.dir, "sshd_config")
	if err := os.WriteFile(serverConf, []byte(fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %[2]s/host_ed25519
PidFile none
AuthorizedKeysFile %[2]s/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 1000
MaxStartups 1000
LogLevel ERROR
Subsystem sftp internal-sftp
`, port, s.dir)), 0o600); err != nil {
		return nil, err
	}
	s.clientConf = filepath.Join(s.dir, "ssh_config")
	common := fmt.Sprintf(`  HostName 127.0.0.1
  Port %d
  User root
  IdentityFile %[2]s/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  Compression no
  LogLevel ERROR
`, port, s.dir)
	if err := os.WriteFile(s.clientConf, []byte("Host bench\n"+common+"\nHost bench-mux\n"+common+
		fmt.Sprintf("  ControlMaster no\n  ControlPath %s/cm-%%C\n", s.dir)), 0o600); err != nil {
		return nil, err
	}
	// sshd refuses to start without its privilege separation directory.
	if _, err := os.Stat("/run/sshd"); os.IsNotExist(err) {
		if err := os.Mkdir("/run/sshd", 0o755); err != nil {
			return nil, err
		}
		s.madeRunDir = true
	}
	s.cmd, s.maskedRC, err = sshdCommand(bin, serverConf, s.dir)
	if err != nil {
		return nil, err
	}
	var errBuf bytes.Buffer
	s.cmd.Stderr = &errBuf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := s.ssh(ctx, "bench", "true").Run()
		if err == nil {
			break
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("sshd exited: %s", errBuf.String())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop(log)
			return nil, fmt.Errorf("sshd did not answer within 15s (%v): %s", err, errBuf.String())
		}
		time.Sleep(50 * time.Millisecond) // a retry interval, not a wait for a state
	}
	log.Info("sshd up", "pid", s.cmd.Process.Pid, "port", port)
	return s, nil
}

// sshdCommand runs sshd in the foreground. bash sources ~/.bashrc for commands sshd
// starts; on a machine where that file is slow (pyenv init takes 0.4 s on ours) every ssh
// case would measure the rc file, not OpenSSH. So when root's shell has an rc file, sshd
// runs in a private mount namespace where an empty file is bound over it: the host is
// untouched and the mount dies with sshd (unshare and sh exec, so the pid is sshd's).
// The namespace is a slave of the host's, so the lease filesystems the daemon mounts
// later are visible to ssh sessions too (the tree case writes into a lease's workdir).
func sshdCommand(bin, conf, dir string) (*exec.Cmd, string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return nil, "", err
	}
	rc := filepath.Join(home, ".bashrc")
	if _, err := os.Stat(rc); err != nil {
		return exec.Command(bin, "-D", "-e", "-f", conf), "", nil
	}
	empty := filepath.Join(dir, "empty-rc")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		return nil, "", err
	}
	return exec.Command("unshare", "--mount", "--propagation", "slave", "--", "sh", "-c",
		`mount --bind "$1" "$2" && exec "$3" -D -e -f "$4"`, "sh", empty, rc, bin, conf), rc, nil
}

// ssh is an ssh command to host ("bench" or "bench-mux") with the chosen cipher.
func (s *sshd) ssh(ctx context.Context, host string, args ...string) *exec.Cmd {
	return s.sshWith(ctx, nil, host, args...)
}

// sshWith is ssh with extra options before the host.
func (s *sshd) sshWith(ctx context.Context, opts []string, host string, args ...string) *exec.Cmd {
	all := append([]string{"-F", s.clientConf, "-c", s.cipher}, opts...)
	return exec.CommandContext(ctx, "ssh", append(append(all, host), args...)...)
}

// sshCommandLine is the ssh command as a shell word list for rsync -e and pipelines.
func (s *sshd) sshCommandLine() string {
	return fmt.Sprintf("ssh -F %s -c %s", shellQuote(s.clientConf), s.cipher)
}

// scp copies with scp -r (when recursive) over a fresh connection with the chosen cipher.
func (s *sshd) scp(ctx context.Context, recursive bool, from, to string) *exec.Cmd {
	args := []string{"-q", "-F", s.clientConf, "-c", s.cipher}
	if recursive {
		args = append(args, "-r")
	}
	return exec.CommandContext(ctx, "scp", append(args, from, to)...)
}

// pickCipher sends n bytes through each candidate cipher twice and keeps the fastest.
// Each try opens a connection of its own, so both pay the same handshake.
func (s *sshd) pickCipher(ctx context.Context, n int64) error {
	best := time.Duration(0)
	var notes []string
	for _, c := range []string{"aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com"} {
		var fastest time.Duration
		for range 2 {
			cmd := exec.CommandContext(ctx, "ssh", "-F", s.clientConf, "-c", c, "bench",
				fmt.Sprintf("head -c %d /dev/zero", n))
			var errBuf bytes.Buffer
			cmd.Stdout, cmd.Stderr = discardCounter{}, &errBuf
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("cipher %s: %v: %s", c, err, errBuf.String())
			}
			if d := time.Since(start); fastest == 0 || d < fastest {
				fastest = d
			}
		}
		notes = append(notes, fmt.Sprintf("%s %.0f MB/s", c, float64(n)/fastest.Seconds()/1e6))
		if best == 0 || fastest < best {
			best, s.cipher = fastest, c
		}
	}
	s.cipherNote = strings.Join(notes, ", ")
	return nil
}

// startMaster opens the shared connection of host bench-mux with the chosen cipher (a
// multiplexed session cannot choose its own). The master goes to the background keeping
// its stdio; with /dev/null for all three, no later Wait waits on a pipe it holds.
func (s *sshd) startMaster(ctx context.Context) error {
	master := exec.CommandContext(ctx, "ssh", "-F", s.clientConf, "-c", s.cipher, "-o", "ControlMaster=yes",
		"-o", "ControlPersist=30m", "-f", "-N", "bench-mux")
	if err := master.Run(); err != nil {
		return fmt.Errorf("ssh multiplexing master: %w", err)
	}
	return nil
}

// stop ends the multiplexing master, then sshd (by pid), and removes /run/sshd if this
// run made it.
func (s *sshd) stop(log *slog.Logger) {
	_ = exec.Command("ssh", "-F", s.clientConf, "-O", "exit", "bench-mux").Run()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		log.Warn("sshd ignored SIGTERM; killing it", "pid", s.cmd.Process.Pid)
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	if s.madeRunDir {
		_ = os.Remove("/run/sshd")
	}
}

// freePort is a loopback TCP port nobody listens on at the moment of asking.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// discardCounter is io.Discard as a distinct type, so exec copies through a pipe like a
// reading client does.
type discardCounter struct{}

func (discardCounter) Write(b []byte) (int, error) { return len(b), nil }
