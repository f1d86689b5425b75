// A real sidecar daemon for the tests: the binary `make build` made, on a loopback port
// with a self-signed certificate and its own state dir, stopped and cleaned up after.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, rmdirSync, writeFileSync, chmodSync, existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "../src/index.js";

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

export interface Daemon {
  client: Client;
  url: string;
  ca: Buffer;
  token: string;
  stop(): Promise<void>;
}

export async function startDaemon(): Promise<Daemon> {
  const bin = process.env.SIDECAR_BIN ?? join(repoRoot, "bin", "sidecar");
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run make build first`);
  // Not under /tmp: a lease's private /tmp would hide a work root there.
  const work = mkdtempSync("/var/tmp/sidecar-ts-");
  chmodSync(work, 0o755);
  const token = randomBytes(32).toString("base64url");
  const tokenFile = join(work, "auth-token");
  writeFileSync(tokenFile, token + "\n", { mode: 0o600 });
  const root = process.getuid?.() === 0;
  const cgroupParent = `sidecar-test-ts-${process.pid}`;
  const child: ChildProcess = spawn(bin, ["serve"], {
    env: {
      PATH: process.env.PATH,
      SIDECAR_STATE_DIR: join(work, "state"),
      SIDECAR_AUTH_TOKEN_FILE: tokenFile,
      SIDECAR_TLS_SELF_SIGNED: "true",
      SIDECAR_LISTEN_ADDR: "127.0.0.1:0",
      SIDECAR_ISOLATION: root ? "strict" : "none",
      SIDECAR_CGROUP_PARENT: cgroupParent,
      SIDECAR_UID_RANGE: "233000-233999",
      SCRIPT_ENABLED: "false",
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  // A test run that dies must not leave the daemon behind.
  const killOnExit = () => child.kill("SIGKILL");
  process.on("exit", killOnExit);
  let stderr = "";
  const env: Record<string, string> = {};
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
        if (m) env[m[1]] = m[2];
      }
      if (env.SANDBOX_REMOTE_URL && env.SANDBOX_REMOTE_CA_FILE) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const ca = readFileSync(env.SANDBOX_REMOTE_CA_FILE);
  const client = new Client({ url: env.SANDBOX_REMOTE_URL, token, ca });
  return {
    client, url: env.SANDBOX_REMOTE_URL, ca, token,
    async stop() {
      for (const l of await client.listLeases().catch(() => [])) {
        await client.releaseLease(l.id).catch(() => undefined);
      }
      client.close();
      child.kill("SIGTERM");
      await exited;
      process.off("exit", killOnExit);
      for (const dir of ["", "cpu/", "cpuacct/", "memory/", "pids/", "freezer/"]) {
        try {
          rmdirSync(`/sys/fs/cgroup/${dir}${cgroupParent}`); // only an empty cgroup goes
        } catch {
          // not there
        }
      }
      rmSync(work, { recursive: true, force: true });
    },
  };
}
