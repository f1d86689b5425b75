# sidecar: the remote sandbox daemon. `make run` and `make test` are the two commands
# the README starts with; keep them working on a fresh machine.

GO         ?= go
GOBIN      ?= $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    := -s -w -X main.version=$(VERSION)
BINDIR     ?= bin
BIN        := $(BINDIR)/sidecar
# State stays in the checkout, except under /tmp: each lease mounts its own /tmp over the
# host's, which would hide a work root there; and except, as root, when an ancestor of the
# checkout is closed to other users (e.g. /root, mode 0700): lease uids could not reach
# their workdirs, so the state goes to /var/lib/sidecar-dev-<checkout path>. CLOSED is
# that ancestor, if any.
CLOSED      = $(if $(filter 0,$(shell id -u)),$(shell d='$(CURDIR)'; while [ "$$d" != / ]; do case "$$(stat -c %A "$$d")" in (*x|*t) ;; (*) echo "$$d"; break;; esac; d=$$(dirname "$$d"); done))
STATE      ?= $(if $(filter /tmp/%,$(CURDIR)),/var/tmp/sidecar-dev$(subst /,-,$(CURDIR)),$(if $(CLOSED),/var/lib/sidecar-dev$(subst /,-,$(CURDIR)),$(CURDIR)/.state))
# As root the daemon isolates leases (cgroups, uids, Landlock); as a normal user it
# cannot, and `make run` says so loudly by asking for isolation "none".
ISOLATION  ?= $(if $(filter 0,$(shell id -u)),strict,none)

# install lays the daemon out as docs/operations.md describes; DESTDIR stages it.
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
UNITDIR    ?= /etc/systemd/system
# The daemon listens on the host's own address, and its certificate names that address,
# the host's name and 127.0.0.1: by default the source address of the default route (or
# the first of `hostname -I`) and `hostname`. install refuses to run when it cannot tell
# them; give LISTEN_ADDR, TLS_IP and TLS_HOST then (or to choose another interface).
TLS_HOST   ?= $(shell hostname 2>/dev/null)
TLS_IP     ?= $(shell { ip -4 route get 192.0.2.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'; hostname -I 2>/dev/null | tr ' ' '\n' | grep '\.'; } | head -n1)
LISTEN_ADDR ?= $(TLS_IP):7443
CONF       := $(DESTDIR)$(SYSCONFDIR)/sidecar

SOAK_LEASES   ?= 32
SOAK_DURATION ?= 30m
FUZZTIME      ?= 10s

.PHONY: all build run env test check tidy vet staticcheck fmt race fuzz fuzz-server soak bench bench-quick clean tools install uninstall vm-test vm-bench fresh-test chart-test console console-test image image-name ts-pack ts-pack-test

all: build

# sidecar-init is the small helper every lease process starts through (it joins the
# cgroup, drops to the lease uid, applies Landlock, then execs); the daemon uses it when
# it sits next to its own binary, and falls back to `sidecar __sandbox-init` otherwise.
# It is built from C when a C compiler ($(CC)) and a static C library (Debian: gcc and
# libc6-dev) exist: a static C helper starts as fast as /bin/true, where the Go one pays
# for the runtime's start on every exec. Without them,
# the Go build of the same helper (same config, same filter, same exit codes) is used, with
# a line saying so, so `make build` works anywhere Go does. A C build that fails is an error.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sidecar
	@if command -v $(firstword $(CC)) >/dev/null 2>&1 && [ "$$($(CC) -print-file-name=libc.a)" != libc.a ]; then \
		echo "$(CC) -O2 -static -Wall -Wextra -Werror -o $(BINDIR)/sidecar-init cmd/sidecar-init/sidecar-init.c"; \
		$(CC) -O2 -static -Wall -Wextra -Werror -o $(BINDIR)/sidecar-init cmd/sidecar-init/sidecar-init.c; \
	else \
		echo "no C compiler ($(CC)) or no static C library (libc6-dev): building the Go sidecar-init"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BINDIR)/sidecar-init ./cmd/sidecar-init; \
	fi

# run: the daemon on its embedded defaults: loopback, self-signed TLS kept in the state
# dir, and a token generated once (printed the first time only). The client settings go
# to $(STATE)/env, which `. "$$(make -s env)"` loads in another shell from any checkout.
# From a closed checkout the binaries run from $(STATE)/bin too: the script workers run
# them as an unprivileged uid.
RUNBIN      = $(if $(CLOSED),$(STATE)/bin,$(BINDIR))
RUN_ADDR   ?= $(or $(SIDECAR_LISTEN_ADDR),127.0.0.1:7443)
# Without mkfs.ext4 (Debian: e2fsprogs) the default disk quota, a filesystem per lease,
# cannot be had: run then meters uploads only (SIDECAR_DISK_QUOTA=off) and says so.
RUN_QUOTA   = $(or $(SIDECAR_DISK_QUOTA),$(if $(shell PATH="$$PATH:/usr/sbin:/sbin" command -v mkfs.ext4),auto,off))
# copy_bins puts the built binaries in $(1), world-readable, when the checkout is closed.
copy_bins = if [ -n "$(CLOSED)" ]; then install -d -m 0755 $(1) && rm -f $(1)/* && \
	for f in $(BIN) $(BINDIR)/sidecar-init; do if [ -e $$f ]; then install -m 0755 $$f $(1)/; fi; done; fi
# running_in prints the pids of the processes running $(1)/sidecar, also once that file
# was replaced (the kernel then says "(deleted)"): a daemon a make run started.
running_in = bin=$$(readlink -f $(abspath $(1))/sidecar || echo $(abspath $(1))/sidecar); for p in /proc/[0-9]*; do \
	case "$$(readlink $$p/exe 2>/dev/null)" in ("$$bin"|"$$bin (deleted)") echo $$p | cut -d/ -f3;; esac; done
# run refuses before it builds when a daemon from this checkout runs: building and copying
# would replace the binaries under it (its sidecar-init starts every lease process).
run:
	@pids=$$($(call running_in,$(RUNBIN)) | tr '\n' ' '); if [ -n "$$pids" ]; then \
		echo "sidecar: a daemon from this checkout already runs (pid $${pids% }, $(RUNBIN)/sidecar); its binaries were left alone. Stop it first (kill $${pids% }), or start another with its own BINDIR, STATE and RUN_ADDR" >&2; exit 1; fi
	@$(MAKE) --no-print-directory build
	@if [ -n "$(CLOSED)" ]; then echo "sidecar: $(CLOSED) is closed to other users, so lease uids could not reach workdirs in this checkout: state, leases and a copy of the binaries go to $(STATE)"; fi
	@mkdir -p $(STATE) && chmod 700 $(STATE)
	@if [ -z "$(SIDECAR_DISK_QUOTA)" ] && [ "$(RUN_QUOTA)" = off ]; then echo "sidecar: no mkfs.ext4 (Debian: apt-get install e2fsprogs), so leases get no filesystem of their own: SIDECAR_DISK_QUOTA=off, disk_bytes binds API uploads only"; fi
	@$(call copy_bins,$(RUNBIN))
	@if [ ! -s $(STATE)/auth-token ]; then \
		umask 077 && $(BIN) token > $(STATE)/auth-token && \
		echo "sidecar: generated a new shared token (shown only this once; kept in $(STATE)/auth-token):" && \
		cat $(STATE)/auth-token; \
	fi
	@printf 'export SANDBOX_PROVIDER=remote\nexport SANDBOX_REMOTE_URL=https://%s\nexport SANDBOX_REMOTE_CA_FILE=%s\nexport SANDBOX_REMOTE_AUTH_TOKEN_FILE=%s\n' \
		'$(subst 0.0.0.0:,127.0.0.1:,$(RUN_ADDR))' '$(STATE)/tls/tls-self-signed.crt' '$(STATE)/auth-token' > $(STATE)/env
	@echo "sidecar: client settings in $(STATE)/env; in another shell: . $(STATE)/env (or, in this checkout: . \"\$$(make -s env)\")"
	SIDECAR_STATE_DIR=$(STATE) SIDECAR_AUTH_TOKEN_FILE=$(STATE)/auth-token SIDECAR_LISTEN_ADDR=$(RUN_ADDR) \
	SIDECAR_TLS_SELF_SIGNED=true SIDECAR_ISOLATION=$(ISOLATION) SIDECAR_DISK_QUOTA=$(RUN_QUOTA) $(RUNBIN)/sidecar serve

# image: the container image of deploy/Containerfile (the chart's image: IMAGE_REPO is its
# values.yaml image.repository and the tag its appVersion), built with docker, or podman
# where docker is absent; IMAGE names another. .dockerignore keeps .git, bin/,
# node_modules, .cache and .state out of the build context.
IMAGE_REPO ?= ghcr.io/sidecar-sandbox/sidecar
IMAGE_TAG  ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' deploy/helm/sidecar/Chart.yaml)
IMAGE      ?= $(IMAGE_REPO):$(IMAGE_TAG)
CONTAINER  ?= $(notdir $(firstword $(shell command -v docker podman 2>/dev/null)))
image:
	@if [ -z "$(CONTAINER)" ]; then echo "make image: needs docker or podman, and neither is on PATH (Debian: apt-get install podman; or CONTAINER=<tool>)" >&2; exit 2; fi
	@if ! $(CONTAINER) info >/dev/null 2>&1; then echo "make image: $(CONTAINER) is installed but '$(CONTAINER) info' fails: is its daemon running (systemctl start docker), or is podman an option (CONTAINER=podman)?" >&2; exit 2; fi
	$(CONTAINER) build -f deploy/Containerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) .
	@echo "built $(IMAGE); push it where the cluster pulls from (or kind load docker-image $(IMAGE)), and give the chart another image.repository/image.tag if you named it otherwise"

# image-name prints the image `make image` builds.
image-name:
	@echo $(IMAGE)

# env prints the path of the client settings `make run` writes, for `. "$$(make -s env)"`.
env:
	@echo $(STATE)/env

# console: the operator console (sidecar/console/web, TypeScript) built with npm into
# sidecar/console/dist, which is committed and embedded, so `make build` needs no Node.js.
# console-test: the committed bundle is what the source builds, and the console works in
# Debian's Chromium (/usr/bin/chromium) against a real daemon.
console:
	cd sidecar/console/web && npm ci --no-audit --no-fund && npm run build

console-test: build
	cd sidecar/console/web && npm ci --no-audit --no-fund && npm run check && npm test

# ts-pack: the TypeScript client (client/ts) as an npm tarball,
# dist/sidecar-sandbox-client-<version>.tgz, for `npm install <path>` in another project
# (the package is private: it is not on the npm registry). Needs Node.js 20+ and npm.
# ts-pack-test: that tarball installs into a fresh project outside the checkout, imports,
# and type-checks from strict TypeScript.
ts-pack:
	mkdir -p dist && cd client/ts && npm ci --no-audit --no-fund && npm pack --pack-destination ../../dist
ts-pack-test: ts-pack
	client/ts/pack-test

# test: what CI runs: formatting, vet, staticcheck, every test with the race detector, and
# a short run of each fuzz target but the server's (fuzz-server).
test: check

check: fmt tidy vet staticcheck race fuzz chart-test

# chart-test: the Helm chart (deploy/helm/sidecar) rendered by Helm's engine, every object
# decoded strictly into the Kubernetes API types, and (as root) the rendered preStop drain
# run against the built daemon for each TLS option. deploy/ is a module of its own, so Helm
# and the Kubernetes types never enter the daemon's go.mod; a few seconds once its
# modules are downloaded.
chart-test: build
	cd deploy && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

# tidy: go.mod says what the code imports, no more, no less (direct dependencies are not
# marked indirect).
tidy:
	$(GO) mod tidy -diff

# fmt checks the tracked Go files; without git (a tarball) every Go file but dependencies'.
fmt:
	@files=$$(git ls-files '*.go' 2>/dev/null) || files=$$(find . -name '*.go' -not -path '*/node_modules/*' -not -path './.cache/*'); \
	out=$$(gofmt -l $$files); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck: tools
	$(GOBIN)/staticcheck ./...

# race: the tests under the race detector, which needs cgo and so a C compiler; on a
# machine with only Go and make they run without it, saying so (CI, which sets
# SIDECAR_TEST_REQUIRE_ALL=1, fails instead).
race:
	@if [ "$$($(GO) env CGO_ENABLED)" = 1 ]; then \
		echo "$(GO) test -race -count=1 -timeout 20m ./..."; $(GO) test -race -count=1 -timeout 20m ./...; \
	elif [ "$$SIDECAR_TEST_REQUIRE_ALL" = 1 ]; then \
		echo "the race detector needs cgo and a C compiler (Debian: gcc)" >&2; exit 1; \
	else \
		echo "no C compiler (cgo is off): the tests run without the race detector (Debian: gcc)"; \
		echo "$(GO) test -count=1 -timeout 20m ./..."; $(GO) test -count=1 -timeout 20m ./...; \
	fi

# From a closed checkout (see STATE) the daemon measured runs from a copy of the binaries,
# as in `make run`: its script workers execute it as an unprivileged uid.
BENCHBIN    = $(if $(CLOSED),$(STATE)/bench-bin,$(BINDIR))

# bench: sidecar beside OpenSSH and the machine's floor, measured in one run (root; it
# installs sshd, ssh and rsync from Debian when missing); ENVD=<binary> adds E2B's envd,
# built outside this repository (docs/benchmarks.md). A full run takes ~13 minutes;
# bench-quick under two. Never part of `make test`.
BENCH_DEPS = command -v sshd >/dev/null && command -v rsync >/dev/null || \
	(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client rsync)

bench: build
	@$(BENCH_DEPS)
	@$(call copy_bins,$(BENCHBIN))
	$(GO) run ./cmd/sidecar-bench -bin $(BENCHBIN)/sidecar $(if $(BENCH_OUT),-out $(BENCH_OUT)) $(if $(ENVD),-envd $(ENVD))

bench-quick: build
	@$(BENCH_DEPS)
	@$(call copy_bins,$(BENCHBIN))
	$(GO) run ./cmd/sidecar-bench -quick -bin $(BENCHBIN)/sidecar

# fuzz runs each fuzz target for a bounded time (their seed corpora also run in `race`).
# Most of its time is compiling every dependency again with coverage instrumentation. FUZZ=0
# leaves it out: make fresh-test does, since fuzzing needs nothing but Go and CI fuzzes in
# its own `make test`. The server's two targets are fuzz-server, not part of `make test`:
# package sidecar imports nearly every package (372, QuickJS's wazero among them), and
# instrumenting them all took 5 of the 7 minutes the six targets took from a cold cache
# on 2 cores, as CI starts; their seed corpora still run in `race` there.
fuzz:
ifeq ($(FUZZ),0)
	@echo "fuzz: left out (FUZZ=0)"
else
	.ci/fuzz-one FuzzTokenVerify  ./lease $(FUZZTIME)
	.ci/fuzz-one FuzzResolve      ./fsxfer $(FUZZTIME)
	.ci/fuzz-one FuzzExtractTar   ./fsxfer $(FUZZTIME)
	.ci/fuzz-one FuzzDecode       ./internal/confine/initproc $(FUZZTIME)
endif

fuzz-server:
	.ci/fuzz-one FuzzDecodeJSON   ./sidecar $(FUZZTIME)
	.ci/fuzz-one FuzzStreamFrames ./sidecar $(FUZZTIME)

# fresh-test: `make test` on a fresh Debian 12 with only Go and make, chrooted (root, and
# debootstrap, which .ci/run installs). See test/fresh/run.
fresh-test:
	test/fresh/run

# vm-test: the isolation and lease checks inside Debian 12's kernel under qemu, once per
# host kind (cgroup v2, v2 without Landlock, v1, v2 delegated, v2 by hand, systemd as
# PID 1 with the installed unit); root, and qemu-system-x86, busybox-static, cpio,
# e2fsprogs, python3 and systemd (.ci/run installs them). See test/vm/run.
vm-test:
	test/vm/run $(VM_VARIANTS)

# vm-bench: the load case inside the VM, cgroup v2 and v1, sidecar against as many local
# fork/execs in the same VM (ratios; times under emulation are slow); what vm-test needs.
VM_BENCH_ARGS ?= -only load
vm-bench:
	VM_BENCH='$(VM_BENCH_ARGS)' test/vm/run $(or $(VM_VARIANTS),v2 v1)

# soak: many leases acquiring, running, transferring and releasing against the built
# daemon for a long time, with a progress line a minute; exits non-zero on any error or
# leak (docs/reliability.md).
soak: build
	$(GO) run ./cmd/sidecar-soak -bin $(BIN) -leases $(SOAK_LEASES) -duration $(SOAK_DURATION)

tools:
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# install is idempotent: binaries, unit and docs are replaced; the env file, the token
# and the TLS files are made once, for this host, and never overwritten.
install: build
	@if [ -z "$(TLS_IP)" ] || [ -z "$(TLS_HOST)" ]; then \
		echo "make install: cannot tell this host's address (TLS_IP=$(TLS_IP)) or name (TLS_HOST=$(TLS_HOST)); give them, e.g." >&2; \
		echo "  make install LISTEN_ADDR=10.0.0.5:7443 TLS_IP=10.0.0.5 TLS_HOST=sandbox.internal" >&2; exit 2; fi
	install -d -m 0755 $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/doc/sidecar
	# The mount point of every lease's workdir (docs/operations.md): the unit's
	# ProtectSystem=strict keeps the daemon from making it at start.
	install -d -m 0755 $(DESTDIR)/workspace
	install -m 0755 $(BIN) $(BINDIR)/sidecar-init $(DESTDIR)$(PREFIX)/bin/
	sed 's#/usr/local/bin/sidecar#$(PREFIX)/bin/sidecar#g; s#/usr/local/share/doc#$(PREFIX)/share/doc#g' \
		systemd/sidecar.service > $(DESTDIR)$(UNITDIR)/sidecar.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/sidecar.service
	install -m 0644 docs/operations.md docs/api.md $(DESTDIR)$(PREFIX)/share/doc/sidecar/
	install -d -m 0700 $(CONF)
	test -e $(CONF)/sidecar.env || (umask 077 && sed '1s#Example\.#Made by make install for $(TLS_HOST).#; s#^SIDECAR_LISTEN_ADDR=.*#SIDECAR_LISTEN_ADDR=$(LISTEN_ADDR)#; s#--host sandbox.internal#--host $(TLS_HOST)#; s#--ip 10.0.0.5#--ip $(TLS_IP)#' \
		systemd/sidecar.env > $(CONF)/sidecar.env)
	test -s $(CONF)/auth-token || (umask 077 && $(BIN) token > $(CONF)/auth-token)
	test -e $(CONF)/tls/server.crt || $(BIN) tls gen --dir $(CONF)/tls --host $(TLS_HOST) $(addprefix --ip ,$(sort $(TLS_IP) 127.0.0.1)) >/dev/null
	@echo "sidecar installed; it listens on $$(sed -n 's/^SIDECAR_LISTEN_ADDR=//p' $(CONF)/sidecar.env) ($(SYSCONFDIR)/sidecar/sidecar.env)."
	@# A sidecar.env kept from an earlier install may name another host's address.
	@addr=$$(sed -n 's/^SIDECAR_LISTEN_ADDR=//p' $(CONF)/sidecar.env); host=$${addr%:*}; \
	if ! { hostname -I 2>/dev/null; echo 127.0.0.1 0.0.0.0; } | tr ' ' '\n' | grep -qxF "$$host"; then \
		echo "warning: $$addr, kept in $(SYSCONFDIR)/sidecar/sidecar.env, is not an address of this host: set SIDECAR_LISTEN_ADDR there, and make a certificate naming it (sidecar tls gen --force), before starting"; fi
	@echo "Start it with: systemctl daemon-reload && systemctl enable --now sidecar"
	@echo "Client lines (copy $(SYSCONFDIR)/sidecar/tls/ca.crt and the token to the app and worker hosts):"
	@echo "  SANDBOX_PROVIDER=remote"
	@echo "  SANDBOX_REMOTE_URL=https://$$(sed -n 's/^SIDECAR_LISTEN_ADDR=//p' $(CONF)/sidecar.env)"
	@echo "  SANDBOX_REMOTE_CA_FILE=$(SYSCONFDIR)/sidecar/tls/ca.crt"
	@echo "  SANDBOX_REMOTE_AUTH_TOKEN_FILE=$(SYSCONFDIR)/sidecar/auth-token"

# uninstall removes what install replaces; configuration, secrets and lease state stay.
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/sidecar $(DESTDIR)$(PREFIX)/bin/sidecar-init $(DESTDIR)$(UNITDIR)/sidecar.service
	rm -f $(DESTDIR)$(PREFIX)/share/doc/sidecar/operations.md $(DESTDIR)$(PREFIX)/share/doc/sidecar/api.md
	-rmdir $(DESTDIR)$(PREFIX)/share/doc/sidecar 2>/dev/null
	-rmdir $(DESTDIR)/workspace 2>/dev/null
	@echo "kept $(SYSCONFDIR)/sidecar (config, token, TLS) and /var/lib/sidecar (leases); remove them by hand if you mean to"

clean:
	rm -rf bin
