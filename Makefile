# sidecar: the remote sandbox daemon. `make run` and `make test` are the two commands
# the README starts with; keep them working on a fresh machine.

GO         ?= go
GOBIN      ?= $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    := -s -w -X main.version=$(VERSION)
BIN        := bin/sidecar
STATE      ?= $(CURDIR)/.state
# As root the daemon isolates leases (cgroups, uids, Landlock); as a normal user it
# cannot, and `make run` says so loudly by asking for isolation "none".
ISOLATION  ?= $(if $(filter 0,$(shell id -u)),strict,none)

.PHONY: all build run test check vet staticcheck fmt race bench bench-quick clean tools

all: build

# sidecar-init is the small helper every lease process starts through (it joins the
# cgroup, drops to the lease uid, applies Landlock, then execs); the daemon uses it when
# it sits next to its own binary, and falls back to `sidecar __sandbox-init` otherwise.
# It is built from C when a C compiler ($(CC)) exists: a static C helper starts as fast
# as /bin/true, where the Go one pays for the runtime's start on every exec. Without a C
# compiler the Go build of the same helper (same config, same exit codes) is used, so
# `make build` works anywhere Go does. A C compiler that is present but fails is an error.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sidecar
	@if command -v $(firstword $(CC)) >/dev/null 2>&1; then \
		echo "$(CC) -O2 -static -Wall -Wextra -Werror -o bin/sidecar-init cmd/sidecar-init/sidecar-init.c"; \
		$(CC) -O2 -static -Wall -Wextra -Werror -o bin/sidecar-init cmd/sidecar-init/sidecar-init.c; \
	else \
		echo "no C compiler ($(CC)): building the Go sidecar-init"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/sidecar-init ./cmd/sidecar-init; \
	fi

# run: the daemon on its embedded defaults: loopback, self-signed TLS kept in the state
# dir, and a token generated once (printed the first time only).
run: build
	@mkdir -p $(STATE) && chmod 700 $(STATE)
	@if [ ! -s $(STATE)/auth-token ]; then \
		umask 077 && $(BIN) token > $(STATE)/auth-token && \
		echo "sidecar: generated a new shared token (shown only this once; kept in $(STATE)/auth-token):" && \
		cat $(STATE)/auth-token; \
	fi
	SIDECAR_STATE_DIR=$(STATE) SIDECAR_AUTH_TOKEN_FILE=$(STATE)/auth-token \
	SIDECAR_TLS_SELF_SIGNED=true SIDECAR_ISOLATION=$(ISOLATION) $(BIN) serve

# test: what CI runs: formatting, vet, staticcheck, and every test with the race detector.
test: check

check: fmt vet staticcheck race

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck: tools
	$(GOBIN)/staticcheck ./...

race:
	$(GO) test -race -count=1 -timeout 20m ./...

tools:
	@test -x $(GOBIN)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

clean:
	rm -rf bin
