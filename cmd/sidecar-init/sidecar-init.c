//go:build ignore

// The constraint above keeps the go tool from treating this file as part of the Go
// package in this directory (a .c file in a package without cgo is an error); the
// Makefile compiles it with $(CC) on its own.

/*
 * sidecar-init: the sandbox helper every lease process starts as, in C so that it starts
 * as fast as /bin/true (the Go helper pays ~2.6 ms of runtime start per exec).
 *
 * It does what internal/confine/initproc does, in the same order, with the same exit codes
 * and report format, reading the same config (see initproc/codec.go):
 *
 *   fd 3  sealed memfd: "sidecar-init/1\0" (key "\0" value "\0")*
 *   fd 4  report pipe: on failure "<code> <stage>: <message>", then exit <code>
 *   fd 5  the lease's network namespace, when the config says "netns"
 *   fd 6  with "await": the launch socket (SOCK_SEQPACKET) of a launcher, below, or with
 *         "await" "fork" the request socket of a zygote (serve_forks)
 *   fd 7  the lease's user namespace, when the config says "userns"
 *   fd 8  the mount namespace to copy, when the config says "mountns"; fds 9 and up its
 *         "tree"s, in their order
 *
 * Steps: join the command's cgroups (v1), join the netns, with "mountns" enter a copy of
 * the namespace on fd 8 and put the trees back (enter_mount_ns), make / private and bind
 * the lease's tmp on /tmp, mount a private /proc (hidepid=invisible) and hide the host's cgroup
 * tree (a cgroup namespace, an empty /sys/fs/cgroup) when dropping to a uid,
 * bind the lease's devpts, its passwd, group and resolv.conf files over /etc's, its home tree on
 * /home and its workdir on /workspace (nosuid,nodev; last); with "root" (a lease in an image) every one of those mounts
 * goes inside that root, through a descriptor opened without following symlinks, with a /dev
 * tmpfs of its own, and the helper then pivots into it; oom_score_adj 500, resource limits, setgroups(0)/setresgid/setresuid (with "userns": setgroups(0), setns into the lease's user namespace and root there), no_new_privs,
 * Landlock, chdir, close-on-exec on every fd above 2, the seccomp filter (the program the
 * daemon assembled, package seccomp, loaded as it is), then an execvp-like PATH search.
 *
 * A launcher (config key "await", no argv/env/dir) does every step but the last ahead of
 * time, then says "R" on fd 6 and waits there for one message: a byte, 'p' (pipes) or 't'
 * (a terminal to make its controlling one), and four descriptors: a sealed memfd holding
 * the command ("sidecar-init/1\0" then argv, env and dir keys only), stdin, stdout, stderr.
 * It takes them on 0-2, enters dir and execs. End of file instead: the daemon let it go;
 * it exits 0. So a command starts with no fork, cgroup move, mount or filter build on its
 * path, in the cgroup, namespaces and Landlock domain it was born into.
 *
 * A zygote (config "await" "fork") joins its cgroup and netns and makes the mounts, then
 * stays, root, and forks a launcher on each request on fd 6 (serve_forks, below): each
 * launcher takes the steps from the cgroup namespace on, in the zygote's view.
 *
 * Security rules: every system call is checked; every length is bounded; untrusted data
 * is only ever a "%s" argument; on any doubt the helper exits 125 with a report.
 *
 * Build: cc -O2 -static -Wall -Wextra -Werror -o sidecar-init sidecar-init.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>

enum { CONFIG_FD = 3, REPORT_FD = 4, NETNS_FD = 5, LAUNCH_FD = 6, USERNS_FD = 7, MOUNTNS_FD = 8, TREE_FD = 9 };
enum { MAX_TREES = 16 }; /* initproc.MaxTrees */
enum { CONFIG_FULL, CONFIG_LAUNCH }; /* what parse_config accepts */
enum { EXIT_SETUP = 125, EXIT_CANNOT_EXEC = 126, EXIT_NOT_FOUND = 127 };
enum { MAX_CONFIG_SIZE = 4 << 20, REPORT_MAX_LENGTH = 1024 };

#define CONFIG_MAGIC "sidecar-init/1"
#define LEASE_OOM_SCORE_ADJ "500"
#define LEASE_UMASK 022 /* initproc.LeaseUmask */
#define ROOT_CAPS 0xa80425fbULL /* initproc.RootCaps: Docker's default set */
#define WORKSPACE "/workspace"
#define HOME_MOUNT "/home" /* where the lease's home tree is bound (initproc.HomeMount) */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* System call numbers and Landlock ABI values, fixed by the kernel ABI; defined here so
 * that the helper builds against older headers than the kernel it runs on. */
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_setns
#define SYS_setns 308
#endif
#ifndef CLONE_NEWNET
#define CLONE_NEWNET 0x40000000
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_SEAL_WRITE 0x0008
#endif
#ifndef MS_REC
#define MS_REC 16384
#endif
#ifndef MS_PRIVATE
#define MS_PRIVATE (1 << 18)
#endif

#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)
#define LL_FS_TRUNCATE (1ULL << 14)
#define LL_FS_IOCTL_DEV (1ULL << 15)
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LL_SCOPE_SIGNAL (1ULL << 1)

#define LL_READ (LL_FS_READ_FILE | LL_FS_READ_DIR)
/* What the kernel accepts in a rule on a non-directory. */
#define LL_FILE (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)
#define LL_DEVICE (LL_FS_READ_FILE | LL_FS_WRITE_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)
#define LL_NO_DEVICES (LL_FS_MAKE_CHAR | LL_FS_MAKE_BLOCK)

struct ll_ruleset_attr { /* struct landlock_ruleset_attr as of ABI 6 */
	uint64_t handled_access_fs;
	uint64_t handled_access_net;
	uint64_t scoped;
};

struct ll_path_beneath_attr {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

/* A list of strings pointing into the config buffer, NULL-terminated (argv, envp). */
struct list {
	char **v;
	size_t n;
};

/* The resource limits a config may set (key "rlimit_<name>", soft = hard = value), as
 * initproc.rlimitResources. */
static const struct {
	const char *key;
	int resource;
} rlimit_keys[] = {
	{"rlimit_nofile", RLIMIT_NOFILE},	{"rlimit_core", RLIMIT_CORE},
	{"rlimit_memlock", RLIMIT_MEMLOCK},	{"rlimit_msgqueue", RLIMIT_MSGQUEUE},
	{"rlimit_sigpending", RLIMIT_SIGPENDING},
};
enum { NRLIMITS = sizeof rlimit_keys / sizeof rlimit_keys[0] };

struct config {
	struct list argv, env, cgroup_procs, detach, tree, ll_rw, ll_rx, ll_ro, ll_dev;
	const char *dir, *tmp_dir, *host_mount_ns, *pts_dir, *passwd, *group, *resolv, *home, *work_dir, *root;
	long uid, gid, ll_min_abi, ll_max_abi;
	int netns, landlock, have_uid, have_gid, await, fork, userns, mountns;
	struct sock_fprog seccomp; /* .len 0: no filter */
	long rlimit[NRLIMITS];
	int have_rlimit[NRLIMITS];
};

/* fail reports "<code> <stage>: <message>" on the report pipe and stderr, then exits. The
 * message is formatted with a constant format only; untrusted text is a %s argument. */
__attribute__((noreturn, format(printf, 3, 4))) static void fail(int code, const char *stage, const char *fmt, ...)
{
	char msg[REPORT_MAX_LENGTH + 1], line[REPORT_MAX_LENGTH + 32];
	va_list ap;
	int n = snprintf(msg, sizeof msg, "%s: ", stage);
	if (n < 0)
		n = 0;
	if ((size_t)n < sizeof msg) {
		va_start(ap, fmt);
		if (vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap) < 0)
			msg[n] = '\0';
		va_end(ap);
	}
	msg[REPORT_MAX_LENGTH] = '\0'; /* truncated like the Go helper's */
	n = snprintf(line, sizeof line, "%d %s", code, msg);
	if (n > 0) {
		size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
		/* Nothing more to do if the daemon is gone: the exit code still says it. */
		ssize_t w = write(REPORT_FD, line, len);
		(void)w;
	}
	dprintf(STDERR_FILENO, "sidecar-init: %s\n", msg);
	_exit(code);
}

#define FAIL_ERRNO(stage, what, arg) fail(EXIT_SETUP, stage, "%s %s: %s", what, arg, strerror(errno))

/* read_config reads the sealed memfd fd into a NUL-terminated buffer and closes fd. */
static char *read_config(int fd, size_t *len)
{
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		fail(EXIT_SETUP, "config", "seals: %s", strerror(errno));
	int want = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
	if ((seals & want) != want)
		fail(EXIT_SETUP, "config", "config is not sealed");
	struct stat st;
	if (fstat(fd, &st) < 0)
		fail(EXIT_SETUP, "config", "stat: %s", strerror(errno));
	if (st.st_size < 0 || st.st_size > MAX_CONFIG_SIZE)
		fail(EXIT_SETUP, "config", "bad config: too large");
	size_t size = (size_t)st.st_size;
	char *buf = malloc(size + 1);
	if (buf == NULL)
		fail(EXIT_SETUP, "config", "out of memory");
	size_t got = 0;
	/* Read one byte past the size: a sealed file cannot grow, so more is an error. */
	while (got <= size) {
		ssize_t r = read(fd, buf + got, size + 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail(EXIT_SETUP, "config", "read: %s", strerror(errno));
		if (r == 0)
			break;
		got += (size_t)r;
	}
	if (got != size)
		fail(EXIT_SETUP, "config", "bad config: size changed");
	if (close(fd) < 0)
		fail(EXIT_SETUP, "config", "close: %s", strerror(errno));
	buf[size] = '\0';
	*len = size;
	return buf;
}

/* parse_id accepts 1 to 10 decimal digits, at most 2^31-1 (as initproc.parseID does). */
static long parse_id(const char *key, const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 10)
		fail(EXIT_SETUP, "config", "bad config: %s: bad number", key);
	long v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			fail(EXIT_SETUP, "config", "bad config: %s: bad number", key);
		v = v * 10 + (s[i] - '0'); /* at most 9999999999: fits a 64-bit long */
	}
	if (v > INT32_MAX)
		fail(EXIT_SETUP, "config", "bad config: %s: number too large", key);
	return v;
}

static const char *const list_keys[] = {"argv", "env", "cgroup_procs", "detach", "tree", "ll_rw", "ll_rx", "ll_ro", "ll_dev"};
enum { NLISTS = sizeof list_keys / sizeof list_keys[0] };

/* lists_of fills lists with c's repeated keys' lists, in list_keys' order. */
static void lists_of(struct config *c, struct list *lists[NLISTS])
{
	struct list *all[NLISTS] = {&c->argv, &c->env, &c->cgroup_procs, &c->detach, &c->tree, &c->ll_rw, &c->ll_rx, &c->ll_ro, &c->ll_dev};
	memcpy(lists, all, sizeof all);
}

static struct list *list_for(struct config *c, const char *key)
{
	struct list *lists[NLISTS];
	lists_of(c, lists);
	for (size_t i = 0; i < NLISTS; i++)
		if (strcmp(key, list_keys[i]) == 0)
			return lists[i];
	return NULL;
}

static void set_once(const char **dst, int *seen, const char *key, const char *v)
{
	if (*seen)
		fail(EXIT_SETUP, "config", "bad config: %s twice", key);
	*seen = 1;
	*dst = v;
}

static long parse_id_once(int *seen, const char *key, const char *v)
{
	const char *unused;
	set_once(&unused, seen, key, v);
	return parse_id(key, v);
}

/* parse_one_once reads a flag key, whose only value is "1", seen at most once. */
static int parse_one_once(int *seen, const char *key, const char *v)
{
	const char *one;
	set_once(&one, seen, key, v);
	if (strcmp(one, "1") != 0)
		fail(EXIT_SETUP, "config", "bad config: %s: not 1", key);
	return 1;
}

static int hex_digit(char ch) { return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1; }

/* parse_filter decodes the "seccomp" value: lowercase hex of 1 to BPF_MAXINSNS struct
 * sock_filter in this host's byte order, as initproc's encodeFilter writes it. */
static void parse_filter(const char *hex, struct sock_fprog *prog)
{
	size_t n = strlen(hex), insn = 2 * sizeof(struct sock_filter);
	if (n == 0 || n % insn != 0 || n / insn > BPF_MAXINSNS)
		fail(EXIT_SETUP, "config", "bad config: seccomp: not a filter program");
	unsigned char *b = malloc(n / 2);
	if (b == NULL)
		fail(EXIT_SETUP, "config", "out of memory");
	for (size_t i = 0; i < n / 2; i++) {
		int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			fail(EXIT_SETUP, "config", "bad config: seccomp: not a filter program");
		b[i] = (unsigned char)(hi << 4 | lo);
	}
	prog->len = (unsigned short)(n / insn);
	prog->filter = (struct sock_filter *)(void *)b; /* malloc's alignment suits it */
}

/* clean_abs says p is a clean absolute path: no empty, "." or ".." component, no trailing
 * "/" (as Go's path.Clean leaves it). */
static int clean_abs(const char *p)
{
	if (p[0] != '/' || p[1] == '\0')
		return 0;
	for (const char *s = p; *s != '\0';) {
		const char *e = strchrnul(s + 1, '/');
		size_t n = (size_t)(e - s - 1);
		if (n == 0 || (n == 1 && s[1] == '.') || (n == 2 && s[1] == '.' && s[2] == '.'))
			return 0;
		s = e;
	}
	return 1;
}

/* under says p lies strictly beneath directory d (both clean and absolute). */
static int under(const char *p, const char *d)
{
	size_t n = strlen(d);
	return strncmp(p, d, n) == 0 && p[n] == '/' && p[n + 1] != '\0';
}

/* detach_root_of is the "detach" root p lies strictly beneath, or NULL. */
static const char *detach_root_of(const struct config *c, const char *p)
{
	if (!clean_abs(p))
		return NULL;
	for (size_t i = 0; i < c->detach.n; i++)
		if (under(p, c->detach.v[i]))
			return c->detach.v[i];
	return NULL;
}

/* check_trees holds "tree" to what enter_mount_ns can put back (as initproc.checkTrees):
 * only with "mountns", at most MAX_TREES, each a clean path beneath a detach root, none
 * beneath or the same as another. */
static void check_trees(const struct config *c)
{
	if (c->tree.n > 0 && !c->mountns)
		fail(EXIT_SETUP, "config", "bad config: tree without mountns");
	if (c->tree.n > MAX_TREES)
		fail(EXIT_SETUP, "config", "bad config: more than %d trees", MAX_TREES);
	for (size_t i = 0; i < c->tree.n; i++) {
		if (detach_root_of(c, c->tree.v[i]) == NULL)
			fail(EXIT_SETUP, "config", "bad config: tree %s: not a clean path under a detach root", c->tree.v[i]);
		for (size_t j = 0; j < c->tree.n; j++)
			if (i != j && (under(c->tree.v[i], c->tree.v[j]) || strcmp(c->tree.v[i], c->tree.v[j]) == 0))
				fail(EXIT_SETUP, "config", "bad config: tree %s: under or the same as another", c->tree.v[i]);
	}
}

/* parse_config splits buf (len bytes, NUL at buf[len]) into c. Two passes: count the list
 * entries, allocate exactly, then fill; strings stay in buf. mode CONFIG_LAUNCH accepts a
 * launched command: argv, env and dir only. */
static void parse_config(char *buf, size_t len, struct config *c, int mode)
{
	memset(c, 0, sizeof *c);
	if (len == 0 || buf[len - 1] != '\0')
		fail(EXIT_SETUP, "config", "bad config: not NUL-terminated");
	size_t mlen = sizeof CONFIG_MAGIC; /* with its NUL */
	if (len < mlen || memcmp(buf, CONFIG_MAGIC, mlen) != 0)
		fail(EXIT_SETUP, "config", "bad config: no magic");
	for (int pass = 0; pass < 2; pass++) {
		int seen_dir = 0, seen_tmp = 0, seen_mns = 0, seen_pts = 0, seen_uid = 0, seen_gid = 0;
		int seen_passwd = 0, seen_group = 0, seen_resolv = 0, seen_home = 0, seen_work = 0, seen_root = 0;
		int seen_netns = 0, seen_ll = 0, seen_ll_max = 0, seen_rules = 0, seen_seccomp = 0, seen_await = 0, seen_userns = 0;
		int seen_mountns = 0;
		int seen_rlimit[NRLIMITS] = {0};
		size_t off = mlen;
		while (off < len) {
			/* Every string ends before len: buf[len-1] is NUL. */
			char *key = buf + off;
			off += strlen(key) + 1;
			if (off >= len)
				fail(EXIT_SETUP, "config", "bad config: key without value");
			char *v = buf + off;
			off += strlen(v) + 1;
			if (mode == CONFIG_LAUNCH && strcmp(key, "argv") != 0 && strcmp(key, "env") != 0 && strcmp(key, "dir") != 0)
				fail(EXIT_SETUP, "config", "bad config: \"%s\" in a launched command", key);
			struct list *l = list_for(c, key);
			if (l != NULL) {
				if (pass == 1)
					l->v[l->n] = v;
				l->n++;
				if (strncmp(key, "ll_", 3) == 0)
					seen_rules = 1;
				continue;
			}
			if (strcmp(key, "dir") == 0) {
				set_once(&c->dir, &seen_dir, key, v);
			} else if (strcmp(key, "tmp_dir") == 0) {
				set_once(&c->tmp_dir, &seen_tmp, key, v);
			} else if (strcmp(key, "host_mount_ns") == 0) {
				set_once(&c->host_mount_ns, &seen_mns, key, v);
			} else if (strcmp(key, "pts_dir") == 0) {
				set_once(&c->pts_dir, &seen_pts, key, v);
			} else if (strcmp(key, "passwd") == 0) {
				set_once(&c->passwd, &seen_passwd, key, v);
			} else if (strcmp(key, "group") == 0) {
				set_once(&c->group, &seen_group, key, v);
			} else if (strcmp(key, "resolv") == 0) {
				set_once(&c->resolv, &seen_resolv, key, v);
			} else if (strcmp(key, "home") == 0) {
				set_once(&c->home, &seen_home, key, v);
			} else if (strcmp(key, "work_dir") == 0) {
				set_once(&c->work_dir, &seen_work, key, v);
			} else if (strcmp(key, "root") == 0) {
				set_once(&c->root, &seen_root, key, v);
			} else if (strcmp(key, "uid") == 0) {
				c->uid = parse_id_once(&seen_uid, key, v);
			} else if (strcmp(key, "gid") == 0) {
				c->gid = parse_id_once(&seen_gid, key, v);
			} else if (strcmp(key, "landlock") == 0) {
				c->ll_min_abi = parse_id_once(&seen_ll, key, v);
			} else if (strcmp(key, "landlock_max_abi") == 0) {
				c->ll_max_abi = parse_id_once(&seen_ll_max, key, v);
				seen_rules = 1;
			} else if (strcmp(key, "netns") == 0) {
				c->netns = parse_one_once(&seen_netns, key, v);
			} else if (strcmp(key, "await") == 0) {
				const char *one;
				set_once(&one, &seen_await, key, v);
				if (strcmp(one, "1") != 0 && strcmp(one, "fork") != 0)
					fail(EXIT_SETUP, "config", "bad config: await: not 1 or fork");
				c->await = 1;
				c->fork = strcmp(one, "fork") == 0;
			} else if (strcmp(key, "userns") == 0) {
				c->userns = parse_one_once(&seen_userns, key, v);
			} else if (strcmp(key, "mountns") == 0) {
				c->mountns = parse_one_once(&seen_mountns, key, v);
			} else if (strcmp(key, "seccomp") == 0) {
				const char *hex;
				set_once(&hex, &seen_seccomp, key, v);
				if (pass == 1)
					parse_filter(hex, &c->seccomp);
			} else if (strncmp(key, "rlimit_", 7) == 0) {
				size_t i = 0;
				while (i < NRLIMITS && strcmp(key, rlimit_keys[i].key) != 0)
					i++;
				if (i == NRLIMITS)
					fail(EXIT_SETUP, "config", "bad config: unknown key \"%s\"", key);
				c->rlimit[i] = parse_id_once(&seen_rlimit[i], key, v);
				c->have_rlimit[i] = 1;
			} else {
				fail(EXIT_SETUP, "config", "bad config: unknown key \"%s\"", key);
			}
		}
		if (pass == 0) {
			struct list *lists[NLISTS];
			lists_of(c, lists);
			for (size_t i = 0; i < NLISTS; i++) {
				/* n <= len/2, so n+1 cannot overflow and calloc checks the product. */
				lists[i]->v = calloc(lists[i]->n + 1, sizeof(char *));
				if (lists[i]->v == NULL)
					fail(EXIT_SETUP, "config", "out of memory");
				lists[i]->n = 0;
			}
			c->dir = c->tmp_dir = c->host_mount_ns = c->pts_dir = c->passwd = c->group = c->resolv = c->home = c->work_dir = c->root = NULL;
			c->netns = c->await = c->fork = c->userns = c->mountns = 0;
			memset(c->have_rlimit, 0, sizeof c->have_rlimit);
			continue;
		}
		if (c->await) {
			if (c->argv.n != 0 || c->env.n != 0 || seen_dir)
				fail(EXIT_SETUP, "config", "bad config: await with a command");
		} else if (c->argv.n == 0 || c->argv.v[0][0] == '\0') {
			fail(EXIT_SETUP, "config", "bad config: empty argv");
		}
		if (mode == CONFIG_LAUNCH)
			return;
		if (!seen_uid || !seen_gid)
			fail(EXIT_SETUP, "config", "bad config: no uid or gid");
		if (c->userns && (c->uid == 0 || c->gid == 0))
			fail(EXIT_SETUP, "config", "bad config: userns without a uid and gid to map root onto");
		if (seen_rules && !seen_ll)
			fail(EXIT_SETUP, "config", "bad config: landlock rules without a policy");
		check_trees(c);
		c->landlock = seen_ll;
	}
}

static void write_file(const char *stage, const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		FAIL_ERRNO(stage, "open", path);
	size_t n = strlen(value);
	ssize_t w = write(fd, value, n);
	if (w < 0)
		FAIL_ERRNO(stage, "write", path);
	if ((size_t)w != n)
		fail(EXIT_SETUP, stage, "write %s: short write", path);
	if (close(fd) < 0)
		FAIL_ERRNO(stage, "close", path);
}

static int has(const char *s) { return s != NULL && s[0] != '\0'; }

/* in_private_ns refuses a mount on dst unless the helper is in a mount namespace of its own
 * whose mounts private_tmp made private (as initproc.inPrivateNS). */
static void in_private_ns(const struct config *c, const char *dst)
{
	char ns[256];
	ssize_t n = readlink("/proc/self/ns/mnt", ns, sizeof ns - 1);
	if (n < 0)
		fail(EXIT_SETUP, "setup", "mount namespace: %s", strerror(errno));
	if ((size_t)n >= sizeof ns - 1)
		fail(EXIT_SETUP, "setup", "mount namespace: name too long");
	ns[n] = '\0';
	if (!has(c->tmp_dir) || !has(c->host_mount_ns) || strcmp(ns, c->host_mount_ns) == 0)
		fail(EXIT_SETUP, "setup", "refusing to mount %s: not in a private mount namespace", dst);
}

/* open_in_root opens p (absolute, as the lease names it) beneath the lease's root without
 * following any symlink (as initproc.inRoot): an O_PATH descriptor, or -1 with errno. */
static int open_in_root(const struct config *c, const char *p)
{
	int root = open(c->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		fail(EXIT_SETUP, "setup", "open root %s: %s", c->root, strerror(errno));
	char rel[PATH_MAX];
	int n = snprintf(rel, sizeof rel, ".%s", p);
	if (n < 0 || (size_t)n >= sizeof rel)
		fail(EXIT_SETUP, "setup", "path too long: %s", p);
	struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
	int fd = (int)syscall(SYS_openat2, root, rel, &how, sizeof how);
	int err = errno;
	close(root);
	errno = err;
	return fd;
}

static void fd_path(char *buf, size_t size, int fd)
{
	int n = snprintf(buf, size, "/proc/self/fd/%d", fd);
	if (n < 0 || (size_t)n >= size)
		fail(EXIT_SETUP, "setup", "format fd path");
}

/* mount_in mounts on p (as the lease names it) inside the root through a descriptor, or on
 * p without one (as initproc.mountIn): mount's result, errno set on failure. */
static int mount_in(const struct config *c, const char *src, const char *p, const char *fstype, unsigned long flags,
		    const char *data)
{
	if (!has(c->root))
		return mount(src, p, fstype, flags, data);
	int fd = open_in_root(c, p);
	if (fd < 0)
		return -1;
	char target[64];
	fd_path(target, sizeof target, fd);
	int r = mount(src, target, fstype, flags, data);
	int err = errno;
	close(fd);
	errno = err;
	return r;
}

/* bind_root makes the root a mount of the helper's namespace (pivot_root needs one), with
 * the mounts under it (as initproc.bindRoot). */
static void bind_root(const struct config *c)
{
	in_private_ns(c, c->root);
	if (mount(c->root, c->root, NULL, MS_BIND | MS_REC, NULL) < 0)
		fail(EXIT_SETUP, "setup", "bind %s on itself: %s", c->root, strerror(errno));
}

/* private_tmp bind-mounts the lease's tmp dir on /tmp, refusing if the helper is still in
 * the daemon's mount namespace (a caller that dropped CLONE_NEWNS). */
static void private_tmp(const struct config *c)
{
	char ns[256];
	ssize_t n = readlink("/proc/self/ns/mnt", ns, sizeof ns - 1);
	if (n < 0)
		fail(EXIT_SETUP, "setup", "mount namespace: %s", strerror(errno));
	if ((size_t)n >= sizeof ns - 1)
		fail(EXIT_SETUP, "setup", "mount namespace: name too long");
	ns[n] = '\0';
	if (c->host_mount_ns == NULL || c->host_mount_ns[0] == '\0' || strcmp(ns, c->host_mount_ns) == 0)
		fail(EXIT_SETUP, "setup", "refusing to mount /tmp: not in a private mount namespace");
	if (mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		fail(EXIT_SETUP, "setup", "make / private: %s", strerror(errno));
	if (has(c->root))
		bind_root(c);
	if (mount_in(c, c->tmp_dir, "/tmp", NULL, MS_BIND, NULL) < 0)
		fail(EXIT_SETUP, "setup", "bind %s on /tmp: %s", c->tmp_dir, strerror(errno));
	if (mount_in(c, "", "/tmp", NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL) < 0)
		fail(EXIT_SETUP, "setup", "remount /tmp nosuid,nodev: %s", strerror(errno));
}

/* bind_private binds src on dst in the private mount namespace. */
static void bind_private(const struct config *c, const char *src, const char *dst)
{
	in_private_ns(c, dst);
	if (mount_in(c, src, dst, NULL, MS_BIND, NULL) < 0)
		fail(EXIT_SETUP, "setup", "bind %s on %s: %s", src, dst, strerror(errno));
}

/* A host that replaces one of its files by rename (useradd and groupadd do, and so do
 * DHCP clients and systemd-resolved with resolv.conf) detaches every bind on the old file
 * in every mount namespace: a lease on the host's root would see the host's file from
 * then on. A zygote keeps a detached copy of each bind of the lease's files and moves it
 * in again where the file at its place is no longer the lease's (heal_user_files): before
 * it forks a launcher, and when the daemon, which watches the host's files, asks ('h').
 * A copy, not the source: that is under a mount the view detaches, from which nothing
 * can be bound. */
#define MAX_USER_FILES 3
static struct {
	const char *dst;
	int tree; /* open_tree(OPEN_TREE_CLONE) of the bind on dst */
	dev_t dev; /* the lease's file, which the bind shows */
	ino_t ino;
} user_files[MAX_USER_FILES];
static size_t n_user_files;

static int clone_bind(const char *dst)
{
	return (int)syscall(SYS_open_tree, AT_FDCWD, dst, OPEN_TREE_CLONE | O_CLOEXEC);
}

/* bind_user_file binds a lease's own passwd, group or resolv.conf on the host's; a zygote
 * on the host's root also keeps a copy of the bind for heal_user_files. */
static void bind_user_file(const struct config *c, const char *src, const char *dst)
{
	bind_private(c, src, dst);
	if (!c->fork || has(c->root))
		return; /* a root's /etc is the lease's own: whatever it renames there stays */
	struct stat st;
	int tree = clone_bind(dst);
	if (tree < 0 || fstat(tree, &st) < 0 || n_user_files == MAX_USER_FILES)
		fail(EXIT_SETUP, "setup", "keep the bind on %s: %s", dst,
		     n_user_files == MAX_USER_FILES ? "too many" : strerror(errno));
	user_files[n_user_files].dst = dst;
	user_files[n_user_files].tree = tree;
	user_files[n_user_files].dev = st.st_dev;
	user_files[n_user_files].ino = st.st_ino;
	n_user_files++;
}

/* heal_user_files moves a kept bind in again where the host's rename detached it, and
 * keeps a copy of that for the next time. A bind that cannot be made again ends the
 * zygote: the daemon then starts the lease's commands the plain way, each in a view
 * made afresh. */
static void heal_user_files(void)
{
	for (size_t i = 0; i < n_user_files; i++) {
		const char *dst = user_files[i].dst;
		struct stat at;
		if (stat(dst, &at) == 0 && at.st_dev == user_files[i].dev && at.st_ino == user_files[i].ino)
			continue;
		if (syscall(SYS_move_mount, user_files[i].tree, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS) < 0)
			fail(EXIT_SETUP, "zygote", "bind %s again: %s", dst, strerror(errno));
		(void)close(user_files[i].tree);
		if ((user_files[i].tree = clone_bind(dst)) < 0)
			fail(EXIT_SETUP, "zygote", "keep the bind on %s: %s", dst, strerror(errno));
	}
}

/* private_bind binds a lease directory (its home tree, its workdir) on dst, nosuid and
 * nodev like /tmp (as initproc.privateBind). */
static void private_bind(const struct config *c, const char *src, const char *dst)
{
	bind_private(c, src, dst);
	if (mount_in(c, "", dst, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL) < 0)
		fail(EXIT_SETUP, "setup", "remount %s nosuid,nodev: %s", dst, strerror(errno));
}

/* private_pts binds the lease's devpts instance on /dev/pts and its ptmx on /dev/ptmx, in the
 * private mount namespace only (private_tmp made the mounts private); a root without an
 * instance gets the host's (as initproc.privatePTS). */
static void private_pts(const struct config *c)
{
	in_private_ns(c, "/dev/pts");
	const char *pts = c->pts_dir, *ptmx = "/dev/pts/ptmx";
	char buf[PATH_MAX];
	if (has(c->root) && !has(pts)) {
		pts = "/dev/pts";
		ptmx = "/dev/ptmx";
	} else if (has(c->root)) {
		int n = snprintf(buf, sizeof buf, "%s/ptmx", pts);
		if (n < 0 || (size_t)n >= sizeof buf)
			fail(EXIT_SETUP, "setup", "path too long: %s", pts);
		ptmx = buf;
	}
	if (mount_in(c, pts, "/dev/pts", NULL, MS_BIND, NULL) < 0)
		fail(EXIT_SETUP, "setup", "bind %s on /dev/pts: %s", pts, strerror(errno));
	if (mount_in(c, ptmx, "/dev/ptmx", NULL, MS_BIND, NULL) < 0)
		fail(EXIT_SETUP, "setup", "bind %s on /dev/ptmx: %s", ptmx, strerror(errno));
}

/* The root's /dev (as initproc.privateDev): a tmpfs with these host devices bound, the
 * /proc/self/fd links and the PTY mount points, read-only once filled. */
static const char *const root_devices[] = {"null", "zero", "full", "random", "urandom", "tty", "ptmx"};
static const char *const root_dev_links[][2] = {
	{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}};
#define DEV_OPTIONS "mode=0755,size=16k,nr_inodes=64"

/* bind_device makes /dev/name in dev and binds the host's on it; ptmx only gets its mount
 * point, for private_pts. */
static void bind_device(int dev, const char *name)
{
	int fd = openat(dev, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0666);
	if (fd < 0)
		fail(EXIT_SETUP, "setup", "/dev/%s: %s", name, strerror(errno));
	if (strcmp(name, "ptmx") != 0) {
		char src[64], target[64];
		int n = snprintf(src, sizeof src, "/dev/%s", name);
		if (n < 0 || (size_t)n >= sizeof src)
			fail(EXIT_SETUP, "setup", "format device path");
		fd_path(target, sizeof target, fd);
		if (mount(src, target, NULL, MS_BIND, NULL) < 0)
			fail(EXIT_SETUP, "setup", "bind /dev/%s: %s", name, strerror(errno));
	}
	close(fd);
}

static void private_dev(const struct config *c)
{
	if (mount_in(c, "tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, DEV_OPTIONS) < 0)
		fail(EXIT_SETUP, "setup", "mount /dev: %s", strerror(errno));
	int dev = open_in_root(c, "/dev");
	if (dev < 0)
		fail(EXIT_SETUP, "setup", "open /dev in the lease root: %s", strerror(errno));
	for (size_t i = 0; i < sizeof root_devices / sizeof root_devices[0]; i++)
		bind_device(dev, root_devices[i]);
	for (size_t i = 0; i < sizeof root_dev_links / sizeof root_dev_links[0]; i++)
		if (symlinkat(root_dev_links[i][1], dev, root_dev_links[i][0]) < 0)
			fail(EXIT_SETUP, "setup", "/dev/%s: %s", root_dev_links[i][0], strerror(errno));
	if (mkdirat(dev, "pts", 0755) < 0)
		fail(EXIT_SETUP, "setup", "/dev/pts: %s", strerror(errno));
	close(dev);
}

static void root_dev_read_only(const struct config *c)
{
	unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
	if (mount_in(c, "", "/dev", NULL, flags, NULL) < 0)
		fail(EXIT_SETUP, "setup", "remount /dev read-only: %s", strerror(errno));
}

/* enter_root pivots into the root and detaches the host's (as initproc.enterRoot). */
static void enter_root(const struct config *c)
{
	if (chdir(c->root) < 0)
		fail(EXIT_SETUP, "setup", "chdir %s: %s", c->root, strerror(errno));
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		fail(EXIT_SETUP, "setup", "pivot_root %s: %s", c->root, strerror(errno));
	if (umount2(".", MNT_DETACH) < 0)
		fail(EXIT_SETUP, "setup", "detach the host's root: %s", strerror(errno));
	if (chdir("/") < 0)
		fail(EXIT_SETUP, "setup", "chdir /: %s", strerror(errno));
}

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#define CGROUP_MOUNT "/sys/fs/cgroup"

/* private_cgroups hides the host's cgroup tree (as initproc.privateCgroups): a cgroup
 * namespace rooted at the cgroup the helper joined, and on a host root an empty read-only
 * tmpfs over /sys/fs/cgroup. */
static void private_cgroups(const struct config *c)
{
	if (!c->fork && unshare(CLONE_NEWCGROUP) < 0)
		fail(EXIT_SETUP, "setup", "cgroup namespace: %s", strerror(errno));
	if (has(c->root))
		return;
	struct stat st;
	if (stat(CGROUP_MOUNT, &st) < 0 || !S_ISDIR(st.st_mode))
		return; /* nothing there to hide */
	if (mount_in(c, "tmpfs", CGROUP_MOUNT, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=4k") < 0)
		fail(EXIT_SETUP, "setup", "hide %s: %s", CGROUP_MOUNT, strerror(errno));
}

/* put_tree puts the detached tree on fd back at path, beneath root, a tmpfs of this
 * namespace's own: the directories down to it are made, then its mount point (a directory,
 * or an empty file for a file's tree), which must be new. */
static void put_tree(const char *root, const char *path, int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		fail(EXIT_SETUP, "setup", "tree %s: %s", path, strerror(errno));
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n >= sizeof buf)
		fail(EXIT_SETUP, "setup", "tree %s: path too long", path);
	memcpy(buf, path, n + 1);
	for (char *s = buf + strlen(root) + 1; (s = strchr(s, '/')) != NULL; *s++ = '/') {
		*s = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			fail(EXIT_SETUP, "setup", "tree %s: mkdir %s: %s", path, buf, strerror(errno));
	}
	if (S_ISDIR(st.st_mode)) {
		if (mkdir(buf, 0700) < 0)
			fail(EXIT_SETUP, "setup", "tree %s: mkdir: %s", path, strerror(errno));
	} else {
		int f = open(buf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (f < 0 || close(f) < 0)
			fail(EXIT_SETUP, "setup", "tree %s: create: %s", path, strerror(errno));
	}
	if (syscall(SYS_move_mount, fd, "", AT_FDCWD, buf, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		fail(EXIT_SETUP, "setup", "tree %s: move_mount: %s", path, strerror(errno));
	if (close(fd) < 0)
		fail(EXIT_SETUP, "setup", "tree %s: close: %s", path, strerror(errno));
}

/* enter_mount_ns (config "mountns") makes the private mount namespace a copy of the one on
 * MOUNTNS_FD, the daemon's without any lease's mounts, not of the daemon's own, whose copy
 * would cost a mount per lease held; then it puts the bind sources (config "tree", on
 * TREE_FD and up) back at their paths, on a tmpfs over each detach root, so that the binds
 * below find what they would in a copy of the daemon's namespace (and no other lease's
 * mounts), and detaching the roots drops them. */
static void enter_mount_ns(const struct config *c)
{
	if (syscall(SYS_setns, MOUNTNS_FD, CLONE_NEWNS) < 0)
		fail(EXIT_SETUP, "setup", "enter the helpers' mount namespace: %s", strerror(errno));
	if (unshare(CLONE_NEWNS) < 0)
		fail(EXIT_SETUP, "setup", "mount namespace: %s", strerror(errno));
	if (close(MOUNTNS_FD) < 0)
		fail(EXIT_SETUP, "setup", "close the helpers' mount namespace: %s", strerror(errno));
	if (mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		fail(EXIT_SETUP, "setup", "make / private: %s", strerror(errno));
	for (size_t i = 0; i < c->detach.n; i++)
		if (mount("tmpfs", c->detach.v[i], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=64k,nr_inodes=1024") < 0)
			fail(EXIT_SETUP, "setup", "tmpfs on %s: %s", c->detach.v[i], strerror(errno));
	for (size_t i = 0; i < c->tree.n; i++)
		put_tree(detach_root_of(c, c->tree.v[i]), c->tree.v[i], TREE_FD + (int)i);
}

/* detach_lease_mounts detaches the directories that hold every lease's mounts from the
 * private mount namespace, last, since every bind has its source there (as
 * initproc.detachLeaseMounts). */
static void detach_lease_mounts(const struct config *c)
{
	if (c->detach.n > 0)
		in_private_ns(c, c->detach.v[0]);
	for (size_t i = 0; i < c->detach.n; i++)
		if (umount2(c->detach.v[i], MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
			fail(EXIT_SETUP, "setup", "detach %s: %s", c->detach.v[i], strerror(errno));
}

/* private_mounts makes the process's view in its private mount namespace, in
 * initproc.privateMounts' order: /tmp, /proc, the root's /dev, PTYs, user files, the
 * workdir last (no source path is ever looked up through /workspace), then the root. */
static void private_mounts(const struct config *c)
{
	if (has(c->tmp_dir)) {
		private_tmp(c);
		/* A lease sees only its own uid's processes in a /proc of its own. */
		if (c->uid != 0 || has(c->root)) {
			if (mount_in(c, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible") < 0)
				fail(EXIT_SETUP, "setup", "mount private /proc: %s", strerror(errno));
			private_cgroups(c);
		}
	} else if (has(c->root)) {
		in_private_ns(c, c->root); /* refuses: a root needs the private namespace */
	}
	if (has(c->root))
		private_dev(c);
	if (has(c->pts_dir) || has(c->root))
		private_pts(c);
	if (has(c->root))
		root_dev_read_only(c);
	if (has(c->passwd))
		bind_user_file(c, c->passwd, "/etc/passwd");
	if (has(c->group))
		bind_user_file(c, c->group, "/etc/group");
	if (has(c->resolv))
		bind_user_file(c, c->resolv, "/etc/resolv.conf");
	if (has(c->home))
		private_bind(c, c->home, HOME_MOUNT);
	if (has(c->work_dir))
		private_bind(c, c->work_dir, WORKSPACE);
	if (has(c->root))
		enter_root(c);
	else
		detach_lease_mounts(c);
}

static int landlock_abi(void)
{
	long v = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
	return v < 0 ? 0 : (int)v;
}

/* handled_fs is every filesystem right the ABI knows, up to ABI 7 (as initproc.handledFS). */
static uint64_t handled_fs(int abi)
{
	uint64_t fs = LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_REMOVE_DIR |
		      LL_FS_REMOVE_FILE | LL_FS_MAKE_CHAR | LL_FS_MAKE_DIR | LL_FS_MAKE_REG | LL_FS_MAKE_SOCK |
		      LL_FS_MAKE_FIFO | LL_FS_MAKE_BLOCK | LL_FS_MAKE_SYM;
	if (abi >= 2)
		fs |= LL_FS_REFER;
	if (abi >= 3)
		fs |= LL_FS_TRUNCATE;
	if (abi >= 5)
		fs |= LL_FS_IOCTL_DEV;
	return fs;
}

static void add_rule(int ruleset, const char *path, uint64_t access)
{
	int fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return; /* e.g. /lib64 on a host without it */
	if (fd < 0)
		fail(EXIT_SETUP, "setup", "landlock rule %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0)
		fail(EXIT_SETUP, "setup", "landlock rule %s: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		access &= LL_FILE; /* the kernel refuses directory rights on a file */
	struct ll_path_beneath_attr rule = {.allowed_access = access, .parent_fd = fd};
	if (syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0) < 0)
		fail(EXIT_SETUP, "setup", "landlock rule %s: %s", path, strerror(errno));
	if (close(fd) < 0)
		fail(EXIT_SETUP, "setup", "landlock rule %s: close: %s", path, strerror(errno));
}

/* build_ruleset makes the lease's Landlock ruleset, its rules opened in this process's
 * view: the best ABI the kernel has (capped at landlock_max_abi when set), never less
 * than the daemon's minimum. -1: a kernel without Landlock (best effort). */
static int build_ruleset(const struct config *c)
{
	int abi = landlock_abi();
	if (c->ll_max_abi > 0 && abi > c->ll_max_abi)
		abi = (int)c->ll_max_abi;
	if (abi < c->ll_min_abi)
		fail(EXIT_SETUP, "setup", "landlock ABI %d, need %ld", abi, c->ll_min_abi);
	if (abi == 0)
		return -1;
	uint64_t fs = handled_fs(abi);
	struct ll_ruleset_attr attr = {.handled_access_fs = fs};
	if (abi >= 6)
		/* No signal to, or abstract socket of, anything outside the lease's domain. */
		attr.scoped = LL_SCOPE_SIGNAL | LL_SCOPE_ABSTRACT_UNIX_SOCKET;
	long rfd = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (rfd < 0)
		fail(EXIT_SETUP, "setup", "landlock_create_ruleset: %s", strerror(errno));
	const struct {
		const struct list *paths;
		uint64_t access;
	} groups[] = {
		{&c->ll_rw, fs & ~LL_NO_DEVICES},
		{&c->ll_rx, LL_READ | LL_FS_EXECUTE},
		{&c->ll_ro, LL_READ},
		{&c->ll_dev, LL_DEVICE | LL_FS_READ_DIR},
	};
	for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
		for (size_t i = 0; i < groups[g].paths->n; i++)
			add_rule((int)rfd, groups[g].paths->v[i], groups[g].access & fs);
	return (int)rfd;
}

/* A zygote's ruleset: built once in its view (serve_forks), before any launcher, and
 * applied by each launcher it forks, which would otherwise open every rule's path again.
 * Its rules name the view's directories and device files, which a heal (a user file
 * bound again) leaves as they are. -1: none (a plain helper builds its own). */
static int zygote_ruleset = -1;

/* restrict_self confines this process (and what it execs) to the lease's policy;
 * no_new_privs is set already. */
static void restrict_self(const struct config *c)
{
	int rfd = zygote_ruleset >= 0 ? zygote_ruleset : build_ruleset(c);
	if (rfd < 0)
		return; /* best effort on a kernel without Landlock */
	if (syscall(SYS_landlock_restrict_self, rfd, 0) < 0)
		fail(EXIT_SETUP, "setup", "landlock_restrict_self: %s", strerror(errno));
	if (close(rfd) < 0)
		fail(EXIT_SETUP, "setup", "landlock ruleset close: %s", strerror(errno));
}

/* install_seccomp loads the daemon's filter on this process, last before exec
 * (no_new_privs is set already). */
static void install_seccomp(const struct config *c)
{
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &c->seccomp) < 0)
		fail(EXIT_SETUP, "setup", "seccomp: %s", strerror(errno));
}

/* set_rlimits sets each configured limit, soft and hard. */
static void set_rlimits(const struct config *c)
{
	for (size_t i = 0; i < NRLIMITS; i++) {
		if (!c->have_rlimit[i])
			continue;
		struct rlimit rl = {.rlim_cur = (rlim_t)c->rlimit[i], .rlim_max = (rlim_t)c->rlimit[i]};
		if (setrlimit(rlimit_keys[i].resource, &rl) < 0)
			fail(EXIT_SETUP, "setup", "%s: %s", rlimit_keys[i].key, strerror(errno));
	}
}

/* enter_userns makes the process root in the lease's user namespace (fd 7), whose only ids
 * map onto the lease's uid and gid: it leaves the host's root behind like a uid drop does,
 * and root there owns what the lease's uid owns on the host and nothing else. setns needs
 * root on the host and a single-threaded process; after it, the process has capabilities
 * in that namespace only. */
static void enter_userns(void)
{
	if (syscall(SYS_setgroups, 0, NULL) < 0)
		fail(EXIT_SETUP, "setup", "setgroups: %s", strerror(errno));
	if (syscall(SYS_setns, USERNS_FD, CLONE_NEWUSER) < 0)
		fail(EXIT_SETUP, "setup", "join user namespace: %s", strerror(errno));
	if (syscall(SYS_setresgid, 0, 0, 0) < 0)
		fail(EXIT_SETUP, "setup", "setresgid 0 in the user namespace: %s", strerror(errno));
	if (syscall(SYS_setresuid, 0, 0, 0) < 0)
		fail(EXIT_SETUP, "setup", "setresuid 0 in the user namespace: %s", strerror(errno));
	/* Joining a user namespace gives every capability in it and a full bounding set,
	 * whatever the daemon's: cut the bound to ROOT_CAPS, which the target's exec then
	 * grants root (no_new_privs keeps it from gaining more). */
	for (int cap = 0; cap < 64; cap++) {
		if (ROOT_CAPS & (1ULL << cap))
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL) /* past the kernel's last capability */
				break;
			fail(EXIT_SETUP, "setup", "drop capability %d from the bound: %s", cap, strerror(errno));
		}
	}
}

/* setup_process runs the steps that are each process's own, after its cgroup and view:
 * the uid drop, no_new_privs (Landlock needs it), Landlock, and the working directory,
 * entered as the lease's uid under the policy; the seccomp filter last. */
static void setup_process(const struct config *c)
{
	/* A zygote's child (below) makes the cgroup namespace its zygote could not have: one
	 * rooted at the cgroup the child was just put in, as private_cgroups does. */
	if (c->fork && has(c->tmp_dir) && (c->uid != 0 || has(c->root)) && unshare(CLONE_NEWCGROUP) < 0)
		fail(EXIT_SETUP, "setup", "cgroup namespace: %s", strerror(errno));
	/* The daemon shields itself from the OOM killer; lease processes must not inherit that. */
	write_file("setup: oom_score_adj", "/proc/self/oom_score_adj", LEASE_OOM_SCORE_ADJ);
	/* Nor the daemon's umask (0077 under its unit). */
	umask(LEASE_UMASK);
	set_rlimits(c);
	if (c->userns) {
		enter_userns();
	} else if (c->uid != 0) {
		/* Raw system calls, like the Go helper: this process has one thread. */
		if (syscall(SYS_setgroups, 0, NULL) < 0)
			fail(EXIT_SETUP, "setup", "setgroups: %s", strerror(errno));
		if (syscall(SYS_setresgid, c->gid, c->gid, c->gid) < 0)
			fail(EXIT_SETUP, "setup", "setresgid %ld: %s", c->gid, strerror(errno));
		if (syscall(SYS_setresuid, c->uid, c->uid, c->uid) < 0)
			fail(EXIT_SETUP, "setup", "setresuid %ld: %s", c->uid, strerror(errno));
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		fail(EXIT_SETUP, "setup", "no_new_privs: %s", strerror(errno));
	if (c->landlock)
		restrict_self(c);
	if (c->dir != NULL && c->dir[0] != '\0' && chdir(c->dir) < 0)
		fail(EXIT_SETUP, "setup", "chdir %s: %s", c->dir, strerror(errno));
	/* Everything above 2 closes at exec; the report pipe stays open until then so that an
	 * exec failure can still be told. */
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		fail(EXIT_SETUP, "setup", "close_range: %s", strerror(errno));
	/* Last: the filter needs no_new_privs, and nothing above may need a denied call. */
	if (c->seccomp.len > 0)
		install_seccomp(c);
}

/* setup runs the steps in the order that keeps each possible: cgroups, namespaces and
 * mounts need root, then the process's own steps. A zygote stops before those: its
 * children take them. */
static void setup(const struct config *c)
{
	char pid[32];
	int n = snprintf(pid, sizeof pid, "%ld", (long)getpid());
	if (n < 0 || (size_t)n >= sizeof pid)
		fail(EXIT_SETUP, "setup", "format pid");
	for (size_t i = 0; i < c->cgroup_procs.n; i++)
		write_file("setup: join cgroup", c->cgroup_procs.v[i], pid);
	if (c->netns && syscall(SYS_setns, NETNS_FD, CLONE_NEWNET) < 0)
		fail(EXIT_SETUP, "setup", "join network namespace: %s", strerror(errno));
	if (c->mountns)
		enter_mount_ns(c);
	private_mounts(c);
	if (!c->fork)
		setup_process(c);
}

static int exec_code(int err) { return err == ENOENT || err == ENOTDIR ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC; }

/* exec_target looks the program up like execvp does, inside the sandbox, and execs it; it
 * returns only to fail with the code that says why. */
__attribute__((noreturn)) static void exec_target(const struct config *c)
{
	char *const *argv = c->argv.v, *const *envp = c->env.v;
	const char *name = argv[0];
	if (strchr(name, '/') != NULL) {
		execve(name, argv, envp);
		int err = errno;
		fail(exec_code(err), "exec", "%s: %s", name, strerror(err));
	}
	const char *path = DEFAULT_PATH;
	for (size_t i = 0; i < c->env.n; i++)
		if (strncmp(envp[i], "PATH=", 5) == 0)
			path = envp[i] + 5;
	int denied = 0;
	char full[PATH_MAX];
	for (const char *p = path;;) {
		const char *end = strchrnul(p, ':');
		size_t dlen = (size_t)(end - p);
		/* Relative entries are a trap (Go's exec.ErrDot): skip them, and empty ones. */
		if (dlen > 0 && p[0] == '/') {
			int err;
			size_t nlen = strlen(name);
			if (dlen + 1 + nlen + 1 > sizeof full) {
				err = ENAMETOOLONG;
			} else {
				memcpy(full, p, dlen);
				full[dlen] = '/';
				memcpy(full + dlen + 1, name, nlen + 1);
				execve(full, argv, envp);
				err = errno;
			}
			if (err == EACCES)
				denied = 1;
			else if (err != ENOENT && err != ENOTDIR)
				fail(exec_code(err), "exec", "%s: %s", name, strerror(err));
		}
		if (*end == '\0')
			break;
		p = end + 1;
	}
	if (denied)
		fail(EXIT_CANNOT_EXEC, "exec", "%s: %s", name, strerror(EACCES));
	fail(EXIT_NOT_FOUND, "exec", "%s: executable file not found in $PATH", name);
}

/* await_launch is a launcher's wait: it says it is ready, then takes the command and its
 * standard descriptors from the launch socket (top of file) into c, and enters its
 * directory. Everything here is allowed by the seccomp filter already in force. */
static void await_launch(struct config *c)
{
	char kind = 'R';
	if (write(LAUNCH_FD, &kind, 1) != 1)
		fail(EXIT_SETUP, "setup", "launch: ready: %s", strerror(errno));
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &kind, .iov_len = 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	ssize_t n;
	do
		n = recvmsg(LAUNCH_FD, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		_exit(0); /* the daemon let this launcher go */
	if (n < 0)
		fail(EXIT_SETUP, "setup", "launch: receive: %s", strerror(errno));
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || (kind != 'p' && kind != 't') || h == NULL ||
	    h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS || h->cmsg_len != CMSG_LEN(4 * sizeof(int)))
		fail(EXIT_SETUP, "setup", "launch: bad message");
	int fds[4];
	memcpy(fds, CMSG_DATA(h), sizeof fds);
	/* 0-2 are the launcher's /dev/null, so the received descriptors are all above 2. */
	for (int i = 0; i < 3; i++)
		if (dup2(fds[i + 1], i) < 0 || close(fds[i + 1]) < 0)
			fail(EXIT_SETUP, "setup", "launch: descriptor %d: %s", i, strerror(errno));
	if (kind == 't' && ioctl(0, TIOCSCTTY, 0) < 0)
		fail(EXIT_SETUP, "setup", "launch: controlling terminal: %s", strerror(errno));
	size_t len;
	char *buf = read_config(fds[0], &len);
	struct config cmd;
	parse_config(buf, len, &cmd, CONFIG_LAUNCH);
	c->argv = cmd.argv;
	c->env = cmd.env;
	c->dir = cmd.dir;
	if (c->dir != NULL && c->dir[0] != '\0' && chdir(c->dir) < 0)
		fail(EXIT_SETUP, "setup", "chdir %s: %s", c->dir, strerror(errno));
	(void)close(LAUNCH_FD);
}

#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#define CLONE_INTO_CGROUP_FLAG 0x200000000ULL

struct clone3_args { /* struct clone_args as of Linux 5.7 (CLONE_ARGS_SIZE_VER2) */
	uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size,
		cgroup;
};

enum { MAX_FORK_FDS = 2 + 16 }; /* a launch socket, a report pipe, and v1's cgroup.procs files */

/* fork_reply answers a fork request on sock: "P<pid>" with the child's pidfd, or "E<message>". */
static void fork_reply(int sock, int pid, int pidfd, int err)
{
	char line[128];
	int n = pid > 0 ? snprintf(line, sizeof line, "P%d", pid) : snprintf(line, sizeof line, "Eclone: %s", strerror(err));
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof u);
	struct iovec iov = {.iov_base = line, .iov_len = (size_t)n};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (pid > 0) {
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(h), &pidfd, sizeof pidfd);
	}
	if (sendmsg(sock, &m, MSG_NOSIGNAL) != n)
		fail(EXIT_SETUP, "fork", "answer: %s", strerror(errno));
}

/* forked_child is a zygote's child: it takes its launch socket and report pipe, its cgroup
 * (v1: it writes itself into the cgroup.procs files the daemon opened; v2: it was born
 * there, or, if clone3 was refused, writes itself into the directory's cgroup.procs),
 * takes the process's own steps and becomes a launcher. */
__attribute__((noreturn)) static void forked_child(struct config *c, char kind, int born_in_cgroup, const int *fds,
						   size_t nfds)
{
	if (dup2(fds[0], LAUNCH_FD) < 0 || dup2(fds[1], REPORT_FD) < 0)
		fail(EXIT_SETUP, "setup", "launcher descriptors: %s", strerror(errno));
	/* Its own session and process group, as the daemon starts every helper. */
	if (setsid() < 0)
		fail(EXIT_SETUP, "setup", "setsid: %s", strerror(errno));
	(void)close(fds[0]);
	(void)close(fds[1]);
	for (size_t i = 2; i < nfds; i++) {
		int procs = fds[i];
		if (kind == 'c' && !born_in_cgroup)
			procs = openat(fds[i], "cgroup.procs", O_WRONLY | O_CLOEXEC);
		if ((kind == 'f' || !born_in_cgroup) && (procs < 0 || write(procs, "0", 1) != 1))
			fail(EXIT_SETUP, "setup", "join cgroup: %s", strerror(errno));
		if (procs != fds[i])
			(void)close(procs);
		(void)close(fds[i]);
	}
	setup_process(c);
	await_launch(c);
	exec_target(c);
}

/* serve_forks is a zygote's loop (config "await" "fork"): a helper that made the cell's
 * view once (network namespace, mounts) and stays, root and unconfined, in it. It says
 * "R" on fd 6, then for each request there forks a launcher with that view, so that
 * making one costs a fork of this small process and the process's own steps, not a fork
 * of the daemon, an exec of this helper and a mount namespace built again. A request is
 * one byte and descriptors: 'f' with the launcher's launch socket, its report pipe, and
 * the cgroup.procs files to join (v1, opened by the daemon as root; none without
 * cgroups), or 'c' with the socket, the pipe and the cgroup directory it is born in
 * (v2, CLONE_INTO_CGROUP). The child is the daemon's (CLONE_PARENT), which waits for it
 * as for one it started; its pidfd goes back with the answer. 'h', alone, heals the
 * lease's user files now (the daemon saw the host rename one) and is answered "H". Before
 * each fork it heals them anyway. End of file: exit 0. Only
 * the daemon holds the other end: no lease process can ask anything of it. */
__attribute__((noreturn)) static void serve_forks(struct config *c)
{
	if (c->landlock) {
		/* Above the descriptors a launcher takes by number, which would replace it. */
		int rfd = build_ruleset(c);
		if (rfd >= 0 && ((zygote_ruleset = fcntl(rfd, F_DUPFD_CLOEXEC, USERNS_FD + 1)) < 0 || close(rfd) < 0))
			fail(EXIT_SETUP, "zygote", "landlock ruleset: %s", strerror(errno));
	}
	char kind = 'R';
	if (write(LAUNCH_FD, &kind, 1) != 1)
		fail(EXIT_SETUP, "zygote", "ready: %s", strerror(errno));
	for (;;) {
		union {
			char buf[CMSG_SPACE(MAX_FORK_FDS * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = {.iov_base = &kind, .iov_len = 1};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
		ssize_t n = recvmsg(LAUNCH_FD, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			_exit(0); /* the daemon let it go */
		if (n < 0)
			fail(EXIT_SETUP, "zygote", "receive: %s", strerror(errno));
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		if (kind == 'h' && h == NULL && (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0) {
			heal_user_files();
			if (write(LAUNCH_FD, "H", 1) != 1)
				fail(EXIT_SETUP, "zygote", "answer: %s", strerror(errno));
			continue;
		}
		if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || h == NULL || h->cmsg_level != SOL_SOCKET ||
		    h->cmsg_type != SCM_RIGHTS || h->cmsg_len < CMSG_LEN(2 * sizeof(int)))
			fail(EXIT_SETUP, "zygote", "bad request");
		int fds[MAX_FORK_FDS];
		size_t nfds = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		memcpy(fds, CMSG_DATA(h), nfds * sizeof(int));
		if ((kind != 'f' && kind != 'c') || (kind == 'c' && nfds != 3))
			fail(EXIT_SETUP, "zygote", "bad request");
		heal_user_files();
		int pidfd = -1, born_in_cgroup = 0;
		long pid = -1;
		errno = ENOSYS;
		if (kind == 'c') {
			struct clone3_args args = {.flags = CLONE_PARENT | CLONE_PIDFD | CLONE_INTO_CGROUP_FLAG,
						   .pidfd = (uint64_t)(uintptr_t)&pidfd,
						   .cgroup = (uint64_t)fds[2]};
			pid = syscall(SYS_clone3, &args, sizeof args);
			born_in_cgroup = pid >= 0;
		}
		/* v1, or clone3 refused (systemd's RestrictNamespaces= makes it ENOSYS, as the
		 * lease's own filter does): clone, whose child joins its cgroup itself. The exit
		 * signal is the zygote's (CLONE_PARENT); the pidfd comes back in parent_tid. */
		if (pid < 0 && errno == ENOSYS)
			pid = syscall(SYS_clone, CLONE_PARENT | CLONE_PIDFD, NULL, &pidfd, NULL, 0);
		if (pid == 0)
			forked_child(c, kind, born_in_cgroup, fds, nfds);
		int err = errno;
		for (size_t i = 0; i < nfds; i++)
			(void)close(fds[i]);
		fork_reply(LAUNCH_FD, (int)pid, pidfd, err);
		if (pid > 0)
			(void)close(pidfd);
	}
}

/* serve_spawns is `sidecar-init spawn ARG`, no config, its request socket (SOCK_SEQPACKET)
 * on fd 3: it starts helpers for the daemon, which holds several descriptors per lease
 * (thousands with a thousand leases) that each helper it forked and exec'd itself would
 * copy and then close in execve, while this process holds a handful. A request is one
 * message:
 *
 *   byte 0     's'
 *   byte 1     flags: SPAWN_NEWNS, a mount namespace of its own (a copy of this process's,
 *              which is the daemon's)
 *   byte 2     n, the descriptor slots, 1 to MAX_SPAWN_SLOTS: fds 3 to 3+n-1 of the helper
 *   n bytes    '1' where the slot is given (the descriptors follow in slot order), '0'
 *              where it stays closed
 *   the rest   the directory the helper starts in, absolute, without NUL
 *
 * The child is the daemon's (CLONE_PARENT, as a zygote's launcher) and a vfork's
 * (CLONE_VM | CLONE_VFORK, on a stack of its own: no page tables copied, this process
 * waits until it has exec'd). It takes its descriptors, its own session and the
 * directory, and execs this binary as `sidecar-init ARG` with an empty environment: what
 * the daemon's own start of a helper gives it. A helper born in a cgroup (v2's
 * CLONE_INTO_CGROUP) is still started by the daemon. The answer is a zygote's: "P<pid>"
 * with the child's pidfd, or "E<message>" when nothing was started. A bad request or the
 * end of the socket ends this process; only the daemon holds the other end. */
enum { SPAWN_NEWNS = 1 };
enum { MAX_SPAWN_SLOTS = TREE_FD - CONFIG_FD + MAX_TREES };

struct spawn {
	int self;	     /* this binary, O_PATH */
	char *const *argv;   /* the helper's */
	const int *fds;	     /* the received descriptors, in slot order */
	const char *slots;   /* '1' given, '0' closed, one per slot */
	int nslots;
	const char *dir;
};

/* spawned_child puts the given descriptors on their slots, closes the others, and execs.
 * It shares the spawner's memory (CLONE_VM) and only writes its own stack; a failure once
 * the report pipe (fd 4) is in place is reported on it like a set-up step's. */
static int spawned_child(void *arg)
{
	const struct spawn *sp = arg;
	int high[MAX_SPAWN_SLOTS];
	for (int i = 0, j = 0; i < sp->nslots; i++) {
		/* Above every slot first: a received descriptor may sit on another's slot. */
		high[i] = sp->slots[i] == '1' ? fcntl(sp->fds[j++], F_DUPFD_CLOEXEC, CONFIG_FD + MAX_SPAWN_SLOTS) : -1;
		if (sp->slots[i] == '1' && high[i] < 0)
			_exit(EXIT_SETUP);
	}
	for (int i = 0; i < sp->nslots; i++) {
		if (high[i] >= 0 ? dup2(high[i], CONFIG_FD + i) < 0 : (close(CONFIG_FD + i) < 0 && errno != EBADF))
			_exit(EXIT_SETUP);
	}
	if (setsid() < 0)
		fail(EXIT_SETUP, "spawn", "setsid: %s", strerror(errno));
	if (chdir(sp->dir) < 0)
		FAIL_ERRNO("spawn", "chdir", sp->dir);
	char *const envp[] = {NULL};
	syscall(SYS_execveat, sp->self, "", sp->argv, envp, AT_EMPTY_PATH);
	fail(EXIT_SETUP, "spawn", "exec: %s", strerror(errno));
}

static char spawn_stack[64 * 1024] __attribute__((aligned(16)));

static int serve_spawns(char *argv0, char *arg)
{
	/* Both above the slots, close-on-exec: no helper inherits them. fail() writes on
	 * REPORT_FD: /dev/null here, so that a received descriptor never lands there. */
	int sock = fcntl(CONFIG_FD, F_DUPFD_CLOEXEC, CONFIG_FD + MAX_SPAWN_SLOTS);
	int self = open("/proc/self/exe", O_PATH | O_CLOEXEC);
	int selfhigh = self < 0 ? -1 : fcntl(self, F_DUPFD_CLOEXEC, CONFIG_FD + MAX_SPAWN_SLOTS);
	int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (sock < 0 || close(CONFIG_FD) < 0 || selfhigh < 0 || close(self) < 0 || null < 0 ||
	    (null != REPORT_FD && (dup3(null, REPORT_FD, O_CLOEXEC) < 0 || close(null) < 0)))
		fail(EXIT_SETUP, "spawn", "descriptors: %s", strerror(errno));
	char *const child_argv[] = {argv0, arg, NULL};
	for (;;) {
		char req[3 + MAX_SPAWN_SLOTS + PATH_MAX];
		union {
			char buf[CMSG_SPACE(MAX_SPAWN_SLOTS * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = {.iov_base = req, .iov_len = sizeof req - 1}; /* room for a NUL */
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
		ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			return 0; /* the daemon let it go */
		if (n < 0)
			fail(EXIT_SETUP, "spawn", "receive: %s", strerror(errno));
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		int fds[MAX_SPAWN_SLOTS];
		size_t nfds = 0;
		if (h != NULL && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
			nfds = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(fds, CMSG_DATA(h), nfds * sizeof(int));
		}
		int nslots = n >= 3 ? (unsigned char)req[2] : 0;
		int flags = n >= 3 ? req[1] : -1;
		size_t given = 0;
		for (int i = 0; i < nslots && 3 + i < n; i++)
			given += req[3 + i] == '1';
		ssize_t dirlen = n - 3 - nslots;
		if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || (h != NULL && CMSG_NXTHDR(&m, h) != NULL) || n < 3 ||
		    req[0] != 's' || (flags & ~SPAWN_NEWNS) != 0 || nslots < 1 || nslots > MAX_SPAWN_SLOTS || dirlen < 1 ||
		    req[3 + nslots] != '/' || memchr(req + 3 + nslots, '\0', (size_t)dirlen) != NULL || nfds != given)
			fail(EXIT_SETUP, "spawn", "bad request");
		for (int i = 0; i < nslots; i++)
			if (req[3 + i] != '0' && req[3 + i] != '1')
				fail(EXIT_SETUP, "spawn", "bad request");
		req[n] = '\0';
		struct spawn sp = {.self = selfhigh, .argv = child_argv, .fds = fds, .slots = req + 3, .nslots = nslots,
				   .dir = req + 3 + nslots};
		/* The exit signal is this process's (CLONE_PARENT); the pidfd comes back in parent_tid. */
		int pidfd = -1;
		int pid = clone(spawned_child, spawn_stack + sizeof spawn_stack,
				CLONE_VM | CLONE_VFORK | CLONE_PARENT | CLONE_PIDFD | ((flags & SPAWN_NEWNS) ? CLONE_NEWNS : 0),
				&sp, &pidfd);
		int err = errno;
		for (size_t i = 0; i < nfds; i++)
			(void)close(fds[i]);
		fork_reply(sock, pid, pidfd, err);
		if (pid > 0)
			(void)close(pidfd);
	}
}

/* serve_userns is `sidecar-init userns`, no config: a user namespace factory for the
 * daemon, which cannot make one itself (only a single-threaded process can) and would pay
 * a fork and exec of this helper for each. For each 'N' on stdin it clones a child into a
 * new user namespace and answers its pid, "<pid>\n"; the daemon writes the namespace's
 * maps from outside, as root on the host, opens /proc/<pid>/ns/user and says 'D', and the
 * child is killed (and reaped at the next request, so that its exit overlaps the daemon's
 * work). The child shares this process's memory (CLONE_VM: no page tables to
 * copy, a fifth of a fork's cost) and only ever waits on a stack of its own. A namespace
 * it cannot make is answered "E <message>\n" and the factory serves on. At end of file on
 * stdin it exits; a child dies with it (PR_SET_PDEATHSIG). */
static char userns_stack[64 * 1024] __attribute__((aligned(16)));
static pid_t userns_factory;

static int hold_userns(void *unused)
{
	(void)unused;
	/* No call here may fail and set errno, which is the factory's (shared memory). */
	(void)close(STDIN_FILENO);
	(void)close(STDOUT_FILENO);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != userns_factory)
		_exit(EXIT_SETUP);
	for (;;)
		pause();
}

static int serve_userns(void)
{
	pid_t child = 0;
	int dying = 0;
	char req, line[64];
	userns_factory = getpid();
	for (;;) {
		ssize_t n = read(STDIN_FILENO, &req, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (child > 0 && !dying) {
			(void)kill(child, SIGKILL); /* the daemon holds the namespace (or is gone) */
			dying = 1;
		}
		if (n > 0 && req != 'N')
			continue;
		/* The stack is the next child's only once the last one is gone. */
		while (child > 0 && waitpid(child, NULL, 0) < 0 && errno == EINTR)
			;
		child = 0;
		dying = 0;
		if (n <= 0)
			return 0;
		int pid = clone(hold_userns, userns_stack + sizeof userns_stack, CLONE_VM | CLONE_NEWUSER | SIGCHLD, NULL);
		int len = pid > 0 ? snprintf(line, sizeof line, "%d\n", pid)
				  : snprintf(line, sizeof line, "E clone: %s\n", strerror(errno));
		if (pid > 0)
			child = (pid_t)pid;
		if (write(STDOUT_FILENO, line, (size_t)len) != len) {
			(void)kill(child, SIGKILL);
			fail(EXIT_SETUP, "userns", "answer: %s", strerror(errno));
		}
	}
}

int main(int argc, char **argv)
{
	size_t len;
	struct config c;
	if (argc == 2 && strcmp(argv[1], "userns") == 0)
		return serve_userns();
	if (argc == 3 && strcmp(argv[1], "spawn") == 0)
		return serve_spawns(argv[0], argv[2]);
	char *buf = read_config(CONFIG_FD, &len);
	parse_config(buf, len, &c, CONFIG_FULL);
#ifdef SIDECAR_INIT_PARSE_ONLY
	/* Test builds only (package sandbox's FuzzHelperConfigParity): stop once parsed. */
	return 0;
#endif
	setup(&c);
	if (c.fork)
		serve_forks(&c);
	if (c.await)
		await_launch(&c);
	exec_target(&c);
}
