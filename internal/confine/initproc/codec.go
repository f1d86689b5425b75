package initproc

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The config on ConfigFD is a flat list of NUL-terminated strings, trivial to parse safely
// in C and Go alike: a magic line, then key/value pairs.
//
//	"sidecar-init/1\0" ( key "\0" value "\0" )*
//
// Repeated keys (argv, env, cgroup_procs, detach, tree, ll_rw, ll_rx, ll_ro, ll_dev) keep their order;
// the others appear at most once; uid and gid exactly once. Numbers are plain decimal (no
// sign, at most 10 digits, at most 2^31-1). "landlock" carries the minimum ABI and turns the
// policy on; "landlock_max_abi" caps the ABI applied (0 or absent: no cap); ll_* keys and
// landlock_max_abi without "landlock" are an error. "seccomp" is the filter program in
// lowercase hex, each instruction (struct sock_filter: code u16, jt u8, jf u8, k u32) in
// the host's byte order, 1 to BPF_MAXINSNS of them. "await" is "1", "fork" or absent (with it
// there is no argv, env or dir: a launcher, launch.go, or with "fork" a zygote); each
// "rlimit_<name>" (a RlimitResources name) at most once. "mountns" is "1"; each "tree"
// (at most MaxTrees, only with "mountns") is a clean absolute path strictly under a
// "detach" root, none under or the same as another. Unknown keys, a missing final NUL and
// anything else unexpected are errors: the helper fails closed.
const configMagic = "sidecar-init/1"

// Config keys.
const (
	keyArgv        = "argv"
	keyEnv         = "env"
	keyDir         = "dir"
	keyUID         = "uid"
	keyGID         = "gid"
	keyCgroupProcs = "cgroup_procs"
	keyTmpDir      = "tmp_dir"
	keyHostMountNS = "host_mount_ns"
	keyNetNS       = "netns"
	keyLandlock    = "landlock"
	keyLandlockMax = "landlock_max_abi"
	keyRW          = "ll_rw"
	keyRX          = "ll_rx"
	keyRO          = "ll_ro"
	keyDev         = "ll_dev"
	keySeccomp     = "seccomp"
	keyPTSDir      = "pts_dir"
	keyPasswd      = "passwd"
	keyGroup       = "group"
	keyResolv      = "resolv"
	keyHome        = "home"
	keyWorkDir     = "work_dir"
	keyRoot        = "root"
	keyDetach      = "detach"
	keyMountNS     = "mountns"
	keyTree        = "tree"
	keyRlimit      = "rlimit_"
	keyAwait       = "await"
	keyUserNS      = "userns"
)

var errConfig = errors.New("bad config")

// Encode writes cfg in the helper's format. A string holding NUL, an empty argv[0] or an
// id outside 0..2^31-1 is an error; the result is at most MaxConfigSize bytes.
func Encode(cfg *Config) ([]byte, error) {
	if cfg.Await != (len(cfg.Argv) == 0) || !cfg.Await && cfg.Argv[0] == "" {
		return nil, fmt.Errorf("%w: empty argv", errConfig)
	}
	if cfg.Await && (len(cfg.Env) > 0 || cfg.Dir != "") {
		return nil, fmt.Errorf("%w: await with a command", errConfig)
	}
	if cfg.Fork && !cfg.Await {
		return nil, fmt.Errorf("%w: fork without await", errConfig)
	}
	var b bytes.Buffer
	var err error
	put := func(key, value string) {
		if err == nil && strings.IndexByte(value, 0) >= 0 {
			err = fmt.Errorf("%w: NUL in %s", errConfig, key)
		}
		b.WriteString(key)
		b.WriteByte(0)
		b.WriteString(value)
		b.WriteByte(0)
	}
	putAll := func(key string, values []string) {
		for _, v := range values {
			put(key, v)
		}
	}
	putID := func(key string, id int) {
		if id < 0 || id > math.MaxInt32 {
			err = fmt.Errorf("%w: %s %d", errConfig, key, id)
		}
		put(key, strconv.Itoa(id))
	}
	b.WriteString(configMagic)
	b.WriteByte(0)
	putAll(keyArgv, cfg.Argv)
	putAll(keyEnv, cfg.Env)
	if cfg.Dir != "" {
		put(keyDir, cfg.Dir)
	}
	putID(keyUID, cfg.UID)
	putID(keyGID, cfg.GID)
	putAll(keyCgroupProcs, cfg.CgroupProcs)
	if cfg.TmpDir != "" {
		put(keyTmpDir, cfg.TmpDir)
	}
	if cfg.HostMountNS != "" {
		put(keyHostMountNS, cfg.HostMountNS)
	}
	if cfg.PTSDir != "" {
		put(keyPTSDir, cfg.PTSDir)
	}
	if cfg.Passwd != "" {
		put(keyPasswd, cfg.Passwd)
	}
	if cfg.Group != "" {
		put(keyGroup, cfg.Group)
	}
	if cfg.Resolv != "" {
		put(keyResolv, cfg.Resolv)
	}
	if cfg.Home != "" {
		put(keyHome, cfg.Home)
	}
	if cfg.WorkDir != "" {
		put(keyWorkDir, cfg.WorkDir)
	}
	if cfg.Root != "" {
		put(keyRoot, cfg.Root)
	}
	putAll(keyDetach, cfg.Detach)
	if cfg.MountNS {
		put(keyMountNS, "1")
	}
	putAll(keyTree, cfg.Trees)
	if terr := checkTrees(cfg); terr != nil {
		err = terr
	}
	if cfg.NetNS {
		put(keyNetNS, "1")
	}
	if p := cfg.Landlock; p != nil {
		putID(keyLandlock, p.MinABI)
		if p.MaxABI != 0 {
			putID(keyLandlockMax, p.MaxABI)
		}
		putAll(keyRW, p.RW)
		putAll(keyRX, p.RX)
		putAll(keyRO, p.RO)
		putAll(keyDev, p.Dev)
	}
	for _, r := range cfg.Rlimits {
		if _, ok := RlimitResources[r.Name]; !ok {
			err = fmt.Errorf("%w: unknown rlimit %q", errConfig, r.Name)
		}
		putID(keyRlimit+r.Name, r.Value)
	}
	if len(cfg.Seccomp) > 0 {
		if len(cfg.Seccomp) > unix.BPF_MAXINSNS {
			err = fmt.Errorf("%w: a seccomp program of %d instructions", errConfig, len(cfg.Seccomp))
		}
		put(keySeccomp, encodeFilter(cfg.Seccomp))
	}
	switch {
	case cfg.Fork:
		put(keyAwait, "fork")
	case cfg.Await:
		put(keyAwait, "1")
	}
	if cfg.UserNS {
		if cfg.UID == 0 || cfg.GID == 0 {
			err = fmt.Errorf("%w: userns without a uid and gid to map root onto", errConfig)
		}
		put(keyUserNS, "1")
	}
	if err != nil {
		return nil, err
	}
	if b.Len() > MaxConfigSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", errConfig, b.Len(), MaxConfigSize)
	}
	return b.Bytes(), nil
}

// Decode parses what Encode wrote, refusing anything else.
func Decode(b []byte) (*Config, error) {
	if len(b) > MaxConfigSize {
		return nil, fmt.Errorf("%w: too large", errConfig)
	}
	if len(b) == 0 || b[len(b)-1] != 0 {
		return nil, fmt.Errorf("%w: not NUL-terminated", errConfig)
	}
	fields := strings.Split(string(b[:len(b)-1]), "\x00")
	if fields[0] != configMagic {
		return nil, fmt.Errorf("%w: no magic", errConfig)
	}
	fields = fields[1:]
	if len(fields)%2 != 0 {
		return nil, fmt.Errorf("%w: key without value", errConfig)
	}
	var cfg Config
	var ll Landlock
	seen := map[string]bool{}
	for i := 0; i < len(fields); i += 2 {
		key, v := fields[i], fields[i+1]
		switch key {
		case keyArgv, keyEnv, keyCgroupProcs, keyDetach, keyTree, keyRW, keyRX, keyRO, keyDev:
		default:
			if seen[key] {
				return nil, fmt.Errorf("%w: %s twice", errConfig, key)
			}
		}
		seen[key] = true
		var err error
		switch key {
		case keyArgv:
			cfg.Argv = append(cfg.Argv, v)
		case keyEnv:
			cfg.Env = append(cfg.Env, v)
		case keyDir:
			cfg.Dir = v
		case keyUID:
			cfg.UID, err = parseID(v)
		case keyGID:
			cfg.GID, err = parseID(v)
		case keyCgroupProcs:
			cfg.CgroupProcs = append(cfg.CgroupProcs, v)
		case keyTmpDir:
			cfg.TmpDir = v
		case keyHostMountNS:
			cfg.HostMountNS = v
		case keyPTSDir:
			cfg.PTSDir = v
		case keyPasswd:
			cfg.Passwd = v
		case keyGroup:
			cfg.Group = v
		case keyResolv:
			cfg.Resolv = v
		case keyHome:
			cfg.Home = v
		case keyWorkDir:
			cfg.WorkDir = v
		case keyRoot:
			cfg.Root = v
		case keyDetach:
			cfg.Detach = append(cfg.Detach, v)
		case keyMountNS:
			if v != "1" {
				err = errors.New("not 1")
			}
			cfg.MountNS = true
		case keyTree:
			cfg.Trees = append(cfg.Trees, v)
		case keyNetNS:
			if v != "1" {
				err = errors.New("not 1")
			}
			cfg.NetNS = true
		case keySeccomp:
			cfg.Seccomp, err = decodeFilter(v)
		case keyAwait:
			if v != "1" && v != "fork" {
				err = errors.New("not 1 or fork")
			}
			cfg.Await, cfg.Fork = true, v == "fork"
		case keyUserNS:
			if v != "1" {
				err = errors.New("not 1")
			}
			cfg.UserNS = true
		case keyLandlock:
			ll.MinABI, err = parseID(v)
		case keyLandlockMax:
			ll.MaxABI, err = parseID(v)
		case keyRW:
			ll.RW = append(ll.RW, v)
		case keyRX:
			ll.RX = append(ll.RX, v)
		case keyRO:
			ll.RO = append(ll.RO, v)
		case keyDev:
			ll.Dev = append(ll.Dev, v)
		default:
			name, ok := strings.CutPrefix(key, keyRlimit)
			if _, known := RlimitResources[name]; !ok || !known {
				return nil, fmt.Errorf("%w: unknown key %q", errConfig, key)
			}
			r := Rlimit{Name: name}
			r.Value, err = parseID(v)
			cfg.Rlimits = append(cfg.Rlimits, r)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errConfig, key, err)
		}
	}
	switch {
	case cfg.Await && (len(cfg.Argv) > 0 || len(cfg.Env) > 0 || seen[keyDir]):
		return nil, fmt.Errorf("%w: await with a command", errConfig)
	case !cfg.Await && (len(cfg.Argv) == 0 || cfg.Argv[0] == ""):
		return nil, fmt.Errorf("%w: empty argv", errConfig)
	case !seen[keyUID] || !seen[keyGID]:
		return nil, fmt.Errorf("%w: no uid or gid", errConfig)
	case cfg.UserNS && (cfg.UID == 0 || cfg.GID == 0):
		return nil, fmt.Errorf("%w: userns without a uid and gid to map root onto", errConfig)
	case !seen[keyLandlock] && (seen[keyRW] || seen[keyRX] || seen[keyRO] || seen[keyDev] || seen[keyLandlockMax]):
		return nil, fmt.Errorf("%w: landlock rules without a policy", errConfig)
	}
	if err := checkTrees(&cfg); err != nil {
		return nil, err
	}
	if seen[keyLandlock] {
		cfg.Landlock = &ll
	}
	return &cfg, nil
}

// checkTrees holds Config.Trees to what the helper can put back: with MountNS, at most
// MaxTrees, each a clean absolute path strictly under a Detach root (where its tmpfs
// goes), none under or the same as another.
func checkTrees(cfg *Config) error {
	if len(cfg.Trees) > 0 && !cfg.MountNS {
		return fmt.Errorf("%w: tree without mountns", errConfig)
	}
	if len(cfg.Trees) > MaxTrees {
		return fmt.Errorf("%w: %d trees, more than %d", errConfig, len(cfg.Trees), MaxTrees)
	}
	for i, t := range cfg.Trees {
		if detachRootOf(cfg.Detach, t) == "" {
			return fmt.Errorf("%w: tree %q: not a clean path under a detach root", errConfig, t)
		}
		for j, u := range cfg.Trees {
			if i != j && (t == u || strings.HasPrefix(t, u+"/")) {
				return fmt.Errorf("%w: tree %q: under or the same as another", errConfig, t)
			}
		}
	}
	return nil
}

// detachRootOf is the root of detach that p lies strictly under, "" if none or if p is
// not a clean absolute path (the C helper checks the same: no empty, "." or ".."
// component, no trailing "/").
func detachRootOf(detach []string, p string) string {
	if !strings.HasPrefix(p, "/") || p != path.Clean(p) {
		return ""
	}
	for _, d := range detach {
		if strings.HasPrefix(p, d+"/") && len(p) > len(d)+1 {
			return d
		}
	}
	return ""
}

// A BindSource is a host path under a Detach root that the helper binds from in its view.
type BindSource struct {
	Path string
	// Recursive: its copy must carry the mounts beneath it (the image root's, or those of
	// a source under it); the others are copied alone, as the helper binds them, which
	// costs the same however many mounts share their filesystem.
	Recursive bool
}

// BindSources are the helper's bind sources under the Detach roots, what MountNS takes as
// Trees, in path order; a source under another goes with that one's copy. The others (the
// host's /etc/resolv.conf) are the host's.
func (c *Config) BindSources() []BindSource {
	var paths []string
	for _, p := range []string{c.TmpDir, c.PTSDir, c.Passwd, c.Group, c.Resolv, c.Home, c.WorkDir, c.Root} {
		if p != "" && detachRootOf(c.Detach, p) != "" {
			paths = append(paths, p)
		}
	}
	// Sorted, a path comes after every path it lies under.
	slices.Sort(paths)
	var out []BindSource
	for _, p := range slices.Compact(paths) {
		i := slices.IndexFunc(out, func(s BindSource) bool { return strings.HasPrefix(p, s.Path+"/") })
		if i >= 0 {
			out[i].Recursive = true
			continue
		}
		out = append(out, BindSource{Path: p, Recursive: p == c.Root})
	}
	return out
}

// parseID accepts what the C helper accepts: 1 to 10 decimal digits, at most 2^31-1.
func parseID(s string) (int, error) {
	if len(s) == 0 || len(s) > 10 {
		return 0, errors.New("bad number")
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errors.New("bad number")
		}
		n = n*10 + int(c-'0')
	}
	if n > math.MaxInt32 {
		return 0, errors.New("number too large")
	}
	return n, nil
}

// sockFilterSize is the size of one instruction (struct sock_filter) in bytes.
const sockFilterSize = 8

// encodeFilter is prog in the config's form: lowercase hex of the kernel's layout.
func encodeFilter(prog []unix.SockFilter) string {
	b := make([]byte, 0, len(prog)*sockFilterSize)
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return hex.EncodeToString(b)
}

// decodeFilter parses what encodeFilter wrote; uppercase hex is refused, as the C helper
// refuses it.
func decodeFilter(v string) ([]unix.SockFilter, error) {
	n := len(v) / (2 * sockFilterSize)
	notHex := func(r rune) bool { return (r < '0' || r > '9') && (r < 'a' || r > 'f') }
	if n == 0 || n > unix.BPF_MAXINSNS || len(v)%(2*sockFilterSize) != 0 || strings.ContainsFunc(v, notHex) {
		return nil, errors.New("not a filter program")
	}
	b, _ := hex.DecodeString(v) // lowercase hex of even length by now
	prog := make([]unix.SockFilter, n)
	for i := range prog {
		in := b[i*sockFilterSize:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return prog, nil
}
