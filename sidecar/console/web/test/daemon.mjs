// A real sidecar daemon with the console on: the binary `make build` made, on a loopback
// port with a self-signed certificate and its own state dir, stopped and cleaned up after.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, rmdirSync, writeFileSync } from "node:fs";
import { request } from "node:https";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

export async function startDaemon() {
  const bin = process.env.SIDECAR_BIN ?? join(repoRoot, "bin", "sidecar");
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run make build first`);
  // Not under /tmp: a lease's private /tmp would hide a work root there.
  const work = mkdtempSync("/var/tmp/sidecar-console-");
  chmodSync(work, 0o755);
  const token = randomBytes(32).toString("base64url");
  const tokenFile = join(work, "auth-token");
  writeFileSync(tokenFile, token + "\n", { mode: 0o600 });
  const root = process.getuid?.() === 0;
  const cgroupParent = `sidecar-test-console-${process.pid}`;
  const child = spawn(bin, ["serve"], {
    env: {
      PATH: process.env.PATH,
      SIDECAR_STATE_DIR: join(work, "state"),
      SIDECAR_AUTH_TOKEN_FILE: tokenFile,
      SIDECAR_TLS_SELF_SIGNED: "true",
      SIDECAR_LISTEN_ADDR: "127.0.0.1:0",
      SIDECAR_ISOLATION: root ? "strict" : "none",
      SIDECAR_CGROUP_PARENT: cgroupParent,
      // A range of its own: no other suite's daemon takes 243000-243999.
      SIDECAR_UID_RANGE: "243000-243999",
      SCRIPT_ENABLED: "false",
      SIDECAR_CONSOLE: "true",
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const removeCgroupParent = () => {
    for (const dir of ["", "cpu/", "cpuacct/", "memory/", "pids/", "freezer/"]) {
      try {
        rmdirSync(`/sys/fs/cgroup/${dir}${cgroupParent}`); // only an empty cgroup goes
      } catch {
        // not there
      }
    }
  };
  const killOnExit = () => child.kill("SIGKILL");
  process.on("exit", killOnExit);
  const exited = new Promise((resolve) => child.on("exit", resolve));
  let stderr = "";
  const env = {};
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no client lines from serve:\n" + stderr)), 60_000);
    child.on("exit", (code) => {
      clearTimeout(timer);
      removeCgroupParent(); // a daemon refused at start may have made it
      reject(new Error(`serve exited ${code}:\n${stderr}`));
    });
    child.stderr.on("data", (b) => {
      stderr += b.toString();
      for (const line of stderr.split("\n")) {
        const m = /^export (\w+)=(.*)$/.exec(line);
        if (m) env[m[1]] = m[2];
      }
      if (env.SANDBOX_REMOTE_URL && env.SANDBOX_REMOTE_AUTH_TOKEN_FILE) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const url = env.SANDBOX_REMOTE_URL;
  const ca = readFileSync(env.SANDBOX_REMOTE_CA_FILE);

  // api sends one request to the daemon, with the shared token unless headers say
  // otherwise, and resolves { status, headers, body }.
  function api(method, path, body, headers = { Authorization: `Bearer ${token}` }) {
    return new Promise((resolve, reject) => {
      const data = body === undefined ? undefined : typeof body === "string" || Buffer.isBuffer(body) ? body : JSON.stringify(body);
      const req = request(url + path, { method, ca, headers: { ...headers, ...(data && typeof body === "object" && !Buffer.isBuffer(body) ? { "Content-Type": "application/json" } : {}) } }, (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      });
      req.on("error", reject);
      req.end(data);
    });
  }

  return {
    url, token, api,
    async stop() {
      const list = await api("GET", "/v1/leases").catch(() => null);
      for (const l of list ? JSON.parse(list.body).leases : []) await api("DELETE", `/v1/leases/${l.id}`).catch(() => undefined);
      child.kill("SIGTERM");
      await exited;
      process.off("exit", killOnExit);
      removeCgroupParent();
      rmSync(work, { recursive: true, force: true });
    },
  };
}
