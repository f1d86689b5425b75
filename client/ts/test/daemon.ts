// A real sidecar daemon for the tests: the binary `make build` made, on a loopback port
// with a self-signed certificate and its own state dir, stopped and cleaned up after.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, rmdirSync, writeFileSync, chmodSync, existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "../src/index.js";

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

/** sidecarBin is the daemon binary under test. */
export function sidecarBin(): string {
  const bin = process.env.SIDECAR_BIN ?? join(repoRoot, "bin", "sidecar");
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run make build first`);
  return bin;
}

export interface Daemon {
  client: Client;
  url: string;
  ca: Buffer;
  token: string;
  /** kill SIGKILLs the daemon (a host lost); stop still cleans up after it. */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

export interface DaemonOptions {
  /** The i-th of several daemons in one run: its own cgroup parent and uid range (a
   * daemon refuses a cgroup parent another one holds). */
  index?: number;
  /** The shared token; a fresh one when absent (a fleet shares one). */
  token?: string;
  /** More environment of the daemon (limits, SIDECAR_TLS_HOSTS). */
  env?: Record<string, string>;
  /** A directory of `sidecar tls gen` (ca.crt, server.crt, server.key) to serve with
   * instead of a self-signed certificate: a fleet's one CA. */
  tlsDir?: string;
}

export async function startDaemon(opts: DaemonOptions = {}): Promise<Daemon> {
  const bin = sidecarBin();
  // Not under /tmp: a lease's private /tmp would hide a work root there.
  const work = mkdtempSync("/var/tmp/sidecar-ts-");
  chmodSync(work, 0o755);
  const token = opts.token ?? randomBytes(32).toString("base64url");
  const tokenFile = join(work, "auth-token");
  writeFileSync(tokenFile, token + "\n", { mode: 0o600 });
  const root = process.getuid?.() === 0;
  const i = opts.index;
  const cgroupParent = `sidecar-test-ts-${process.pid}` + (i === undefined ? "" : `-${i}`);
  // Fleet members: 235000 + 1000 i, away from the single daemon's range and the Go suites'.
  const uidRange = i === undefined ? "233000-233999" : `${235000 + 1000 * i}-${235999 + 1000 * i}`;
  const serveEnv = {
    PATH: process.env.PATH,
    SIDECAR_STATE_DIR: join(work, "state"),
    SIDECAR_AUTH_TOKEN_FILE: tokenFile,
    ...(opts.tlsDir
      ? { SIDECAR_TLS_CERT_FILE: join(opts.tlsDir, "server.crt"), SIDECAR_TLS_KEY_FILE: join(opts.tlsDir, "server.key") }
      : { SIDECAR_TLS_SELF_SIGNED: "true" }),
    SIDECAR_LISTEN_ADDR: "127.0.0.1:0",
    SIDECAR_ISOLATION: root ? "strict" : "none",
    SIDECAR_CGROUP_PARENT: cgroupParent,
    SIDECAR_UID_RANGE: uidRange,
    SCRIPT_ENABLED: "false",
    ...opts.env,
  };
  let run = await serve(bin, serveEnv);
  let killed = false;
  const ca = readFileSync(opts.tlsDir ? join(opts.tlsDir, "ca.crt") : run.env.SANDBOX_REMOTE_CA_FILE);
  const client = new Client({ url: run.env.SANDBOX_REMOTE_URL, token, ca });
  return {
    client, url: run.env.SANDBOX_REMOTE_URL, ca, token,
    async kill() {
      await run.kill("SIGKILL");
      killed = true;
    },
    async stop() {
      let c = client;
      if (killed) {
        // What a killed daemon left (its spare lease's mounts and cgroups, the bind of its
        // state dir) goes as an operator's goes: start it again, on a port of its own,
        // and stop it (docs/operations.md, "Troubleshooting"); its leases go first.
        run = await serve(bin, serveEnv);
        client.close();
        c = new Client({ url: run.env.SANDBOX_REMOTE_URL, token, ca });
      }
      for (const l of await c.listLeases().catch(() => [])) {
        await c.releaseLease(l.id).catch(() => undefined);
      }
      c.close();
      await run.kill("SIGTERM");
      for (const dir of ["", "cpu/", "cpuacct/", "memory/", "pids/", "freezer/"]) {
        try {
          rmdirSync(`/sys/fs/cgroup/${dir}${cgroupParent}`); // only an empty cgroup goes
        } catch {
          // not there
        }
      }
      unbindState(join(work, "state"));
      rmSync(work, { recursive: true, force: true });
    },
  };
}

interface Serving {
  /** env holds the `export NAME=value` lines serve printed. */
  env: Record<string, string>;
  /** kill sends sig and waits for the daemon to exit. */
  kill(sig: NodeJS.Signals): Promise<void>;
}

/** serve starts `sidecar serve` and waits for the client lines it prints once listening. */
async function serve(bin: string, env: Record<string, string | undefined>): Promise<Serving> {
  const child: ChildProcess = spawn(bin, ["serve"], { env, stdio: ["ignore", "ignore", "pipe"] });
  // A test run that dies must not leave the daemon behind.
  const killOnExit = () => child.kill("SIGKILL");
  process.on("exit", killOnExit);
  let stderr = "";
  const printed: Record<string, string> = {};
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no client lines from serve:\n" + stderr)), 60_000);
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited ${code}:\n${stderr}`));
    });
    child.stderr!.on("data", (b: Buffer) => {
      stderr += b.toString();
      for (const line of stderr.split("\n")) {
        const m = /^export (\w+)=(.*)$/.exec(line);
        if (m) printed[m[1]] = m[2];
      }
      // The token file's line comes last (the CA file's only when self-signed).
      if (printed.SANDBOX_REMOTE_URL && printed.SANDBOX_REMOTE_AUTH_TOKEN_FILE) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  return {
    env: printed,
    async kill(sig) {
      child.kill(sig);
      await exited;
      process.off("exit", killOnExit);
    },
  };
}

/** unbindState takes off the bind a strict daemon makes of its state dir and removes at
 * its stop: one killed (kill()) leaves it, for its next start (docs/operations.md). */
function unbindState(state: string): void {
  const mounted = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((line) => line.split(" ")[4] === state);
  if (!mounted) return;
  const r = spawnSync("umount", [state], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`umount ${state}: ${r.stderr || r.error}`);
}
