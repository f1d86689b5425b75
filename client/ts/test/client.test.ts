// The TypeScript client against the real daemon (node --test, run from .ci/run).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Readable, type Writable } from "node:stream";
import { finished } from "node:stream/promises";
import { createServer, type AddressInfo } from "node:net";
import {
  SidecarError, NotFoundError, LeaseNotFoundError, InvalidRequestError, PathOutsideWorkdirError,
  errorFromReply, errorClasses, readAll, escapePath, WORKSPACE, DrainingError, UnavailableError,
  ShellBusyError, ShellNotFoundError, outputParts, outputWithMarker, type LeaseHandle, type Process, Client,
} from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

let d: Daemon;
before(async () => {
  d = await startDaemon();
});
after(async () => {
  await d?.stop();
});

async function lease(session: string): Promise<LeaseHandle> {
  return d.client.acquire({ session_id: session });
}

// eventually polls cond until it holds or a generous deadline passes.
async function eventually(what: string, cond: () => Promise<boolean> | boolean): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("a problem code maps to its typed error", { timeout: 120_000 }, async () => {
  await assert.rejects(d.client.getLease("lnosuchlease"), (err: unknown) => {
    assert.ok(err instanceof LeaseNotFoundError, `got ${err}`);
    assert.ok(err instanceof NotFoundError && err instanceof SidecarError);
    assert.equal(err.code, "lease_not_found");
    assert.equal(err.status, 404);
    return true;
  });
  const l = await lease("typed-errors");
  await assert.rejects(l.exec({ argv: [] }), InvalidRequestError);
  // The daemon's refusal of an escaping path (the client's own check is bypassed here).
  await assert.rejects(
    d.client.send({ method: "GET", path: `/v1/leases/${l.id}/files/%2e%2e%2fetc%2fpasswd` }),
    (err: unknown) => err instanceof PathOutsideWorkdirError || err instanceof NotFoundError,
  );
  // Every code of the document has a class, and the class carries the code.
  for (const [code, cls] of Object.entries(errorClasses)) {
    const e = errorFromReply(400, "application/problem+json", Buffer.from(JSON.stringify({ type: "x", title: "t", status: 400, code })));
    assert.ok(e instanceof cls && e.code === code, code);
  }
  await l.release();
});

test("a draining daemon refuses a new lease with DrainingError and keeps a session's", { timeout: 120_000 }, async () => {
  const kept = await lease("ts-drain-kept");
  const st = await d.client.drain(true);
  try {
    assert.equal(st.draining, true);
    await assert.rejects(d.client.acquire({ session_id: "ts-drain-new" }), (err: unknown) => {
      assert.ok(err instanceof DrainingError && err instanceof UnavailableError, `got ${err}`);
      assert.equal((err as SidecarError).status, 503);
      return true;
    });
    kept.stopRenewing();
    const again = await d.client.acquire({ session_id: "ts-drain-kept" });
    assert.equal(again.id, kept.id);
    await again.release();
  } finally {
    assert.equal((await d.client.drain(false)).draining, false);
  }
});

test("leases renew themselves, run commands and move files", { timeout: 120_000 }, async () => {
  const l = await d.client.acquire({ session_id: "basics", ttl_seconds: 3 });
  const first = l.info.expires_at;
  await eventually("a renewal", () => l.info.expires_at > first);
  assert.equal(l.renewError, undefined);

  const res = await l.exec({ argv: ["sh", "-c", "echo out; echo err >&2; exit 3"] });
  assert.equal(res.stdout, "out\n");
  assert.equal(res.stderr, "err\n");
  assert.equal(res.exit_code, 3);

  // 3 MiB between a unique first and last line: both come back, the bytes dropped between
  // them counted exactly, and the helpers split the output there.
  const big = await l.exec({ argv: ["sh", "-c", "echo FIRST-LINE; head -c 3145728 /dev/zero | tr '\\0' x; echo; echo LAST-LINE"] });
  const max = (await d.client.info()).limits.max_output_bytes;
  const total = "FIRST-LINE\n".length + 3 * 2 ** 20 + 1 + "LAST-LINE\n".length;
  assert.equal(big.stdout.length, max);
  assert.equal(big.stdout_truncated, true);
  assert.equal(big.stdout_dropped, total - max);
  assert.equal(big.stdout_dropped_at, max / 2);
  const { head, tail } = outputParts(big.stdout, big.stdout_dropped, big.stdout_dropped_at);
  assert.ok(head.startsWith("FIRST-LINE\nxxx") && head.length === max / 2);
  assert.ok(tail.endsWith("xxx\nLAST-LINE\n") && tail.length === max / 2);
  assert.equal(outputWithMarker(big.stdout, big.stdout_dropped, big.stdout_dropped_at),
    `${head}\n[… ${total - max} bytes dropped …]\n${tail}`);
  const tailOnly = await l.exec({ argv: ["sh", "-c", "echo FIRST-LINE; head -c 3145728 /dev/zero"], output_head_bytes: 0 });
  assert.equal(tailOnly.stdout_dropped_at, 0);
  assert.ok(!tailOnly.stdout.includes("FIRST-LINE"));
  await assert.rejects(l.exec({ argv: ["true"], output_head_bytes: max + 1 }), InvalidRequestError);
  // A character cut by the drop is dropped whole: the parts stay where a reader looks.
  // Lines of 7 bytes ("é😀\n"): a head of 1002 bytes ends in the first byte of an é.
  const wide = await l.exec({ argv: ["sh", "-c", "yes 'é😀' | head -c 2999997"], output_head_bytes: 1002 });
  const parts = outputParts(wide.stdout, wide.stdout_dropped, wide.stdout_dropped_at);
  assert.ok(!wide.stdout.includes("\ufffd"));
  assert.equal(Buffer.byteLength(parts.head), 1001);
  assert.ok(parts.head.endsWith("é😀\n") && parts.tail.endsWith("é😀\n"));
  assert.equal([...parts.head].length, wide.stdout_dropped_at);
  assert.equal(Buffer.byteLength(parts.head) + Buffer.byteLength(parts.tail) + wide.stdout_dropped, 2999997);

  await l.writeFile("dir/a.txt", "hello", { mkdirs: true, mode: 0o600 });
  assert.equal((await l.readFile("dir/a.txt")).toString(), "hello");
  const st = await l.stat("dir/a.txt");
  assert.equal(st.type, "file");
  assert.equal(st.size, 5);
  assert.equal(st.mode, "0600");
  await l.mkdir("dir/sub");
  await l.move("dir/a.txt", "dir/sub/b.txt");
  const names = (await l.list("dir/sub")).map((e) => e.name);
  assert.deepEqual(names, ["b.txt"]);
  assert.ok((await l.list(".")).some((e) => e.name === "dir" && e.type === "dir"));
  await l.remove("dir", true);
  await assert.rejects(l.stat("dir"), NotFoundError);
  await l.release();
  await assert.rejects(d.client.getLease(l.id), LeaseNotFoundError);
});

test("the workdir is /workspace to the file calls (and, isolated, to the lease)", { timeout: 120_000 }, async () => {
  assert.equal(escapePath("/workspace/a b/./c"), "/workspace/a%20b/c");
  assert.equal(escapePath(WORKSPACE), "/workspace");
  assert.throws(() => escapePath("/etc/passwd"));
  assert.throws(() => escapePath("/workspaces/x"));
  assert.throws(() => escapePath("/workspace/../etc"));
  const l = await lease("workspace");
  assert.equal(l.info.workdir, "/workspace");
  await l.exec({ argv: ["sh", "-c", "echo hi > a.txt"] });
  assert.equal((await l.readFile("/workspace/a.txt")).toString(), "hi\n");
  await l.writeFile("/workspace/b.txt", "bee");
  assert.equal((await l.readFile("b.txt")).toString(), "bee");
  assert.ok((await l.list("/workspace")).some((e) => e.name === "a.txt"));
  if (process.getuid?.() === 0) {
    const res = await l.exec({ argv: ["sh", "-c", "pwd; whoami"] });
    assert.equal(res.stdout, "/workspace\nuser\n");
  }
  await l.release();
});

// tar runs the system tar with its stdout (or stdin) as a stream.
function tar(args: string[], input?: Readable): Readable {
  const p = spawn("tar", args, { stdio: [input ? "pipe" : "ignore", "pipe", "inherit"] });
  if (input) input.pipe(p.stdin as Writable);
  return p.stdout!;
}

test("directory trees go in and out as tar streams", { timeout: 120_000 }, async () => {
  const l = await lease("trees");
  const src = mkdtempSync("/var/tmp/sidecar-ts-tree-");
  try {
    mkdirSync(join(src, "a/b"), { recursive: true });
    writeFileSync(join(src, "a/b/c.txt"), "deep");
    writeFileSync(join(src, "top.txt"), "top");
    const stats = await l.putTree("proj", tar(["-C", src, "-cf", "-", "."]));
    assert.equal(stats.Files, 2);
    assert.equal((await l.readFile("proj/a/b/c.txt")).toString(), "deep");
    const out = mkdtempSync("/var/tmp/sidecar-ts-tree-out-");
    try {
      const extract = spawn("tar", ["-C", out, "-xf", "-"], { stdio: ["pipe", "inherit", "inherit"] });
      (await l.getTree("proj")).pipe(extract.stdin);
      await new Promise((r) => extract.on("exit", r));
      assert.equal(readFileSync(join(out, "a/b/c.txt"), "utf8"), "deep");
      assert.equal(readFileSync(join(out, "top.txt"), "utf8"), "top");
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  } finally {
    rmSync(src, { recursive: true, force: true });
  }
  await l.release();
});

// pattern is n deterministic bytes, produced in 1 MiB chunks (never held whole).
function pattern(n: number): Readable {
  let sent = 0;
  let block = 0;
  return new Readable({
    read() {
      if (sent >= n) {
        this.push(null);
        return;
      }
      const size = Math.min(1 << 20, n - sent);
      const chunk = Buffer.alloc(size);
      for (let off = 0; off < size; off += 32) {
        createHash("sha256").update(`block ${block++}`).digest().copy(chunk, off);
      }
      sent += size;
      this.push(chunk);
    },
  });
}

test("a 64 MiB upload arrives with the digest it left with", { timeout: 120_000 }, async () => {
  const l = await lease("big-upload");
  const size = 64 << 20;
  const want = createHash("sha256");
  for await (const chunk of pattern(size)) want.update(chunk as Buffer);
  const digest = want.digest();
  await l.upload("big.bin", pattern(size), { digest: digest.toString("base64") });
  const res = await l.exec({ argv: ["sha256sum", "big.bin"] });
  assert.equal(res.stdout.split(" ")[0], digest.toString("hex"));
  const dl = await l.download("big.bin", { digest: true });
  assert.equal(dl.headers["repr-digest"], `sha-256=:${digest.toString("base64")}:`);
  const got = createHash("sha256");
  let n = 0;
  for await (const chunk of dl) {
    got.update(chunk as Buffer);
    n += (chunk as Buffer).length;
  }
  assert.equal(n, size);
  assert.deepEqual(got.digest(), digest);
  await l.release();
});

test("20,000 counted lines arrive byte-identical through three dropped connections", { timeout: 120_000 }, async () => {
  const l = await lease("resume");
  const lines = 20_000;
  const want = Array.from({ length: lines }, (_, i) => `line ${i + 1}\n`).join("");
  const p: Process = await l.start({ argv: ["sh", "-c", `i=1; while [ $i -le ${lines} ]; do echo "line $i"; i=$((i+1)); done`] });
  // Drop the connection each time the delivered output crosses one of these offsets.
  const dropsAt = [20_000, 60_000, 110_000];
  const chunks: Buffer[] = [];
  p.stdout.on("data", (b: Buffer) => {
    chunks.push(b);
    if (dropsAt.length > 0 && p.offset >= dropsAt[0]) {
      dropsAt.shift();
      p.dropConnection();
    }
  });
  const st = await p.wait();
  await finished(p.stdout);
  const got = Buffer.concat(chunks).toString();
  assert.equal(st.exit_code, 0);
  assert.equal(dropsAt.length, 0, "not every drop happened");
  assert.equal(p.connections, 4);
  assert.equal(p.lost, 0);
  assert.equal(got.length, want.length);
  assert.ok(got === want, "the output differs");
  await l.release();
});

test("a lossless viewer gets every byte and holds the process back while it does not read", { timeout: 120_000 }, async () => {
  const l = await lease("lossless");
  const total = 32 << 20;
  const p: Process = await l.start({ argv: ["sh", "-c", `head -c ${total} /dev/urandom | tee out`], lossless: true });
  assert.equal(p.lossless, true);
  await eventually("output", async () => (await l.process(p.id)).output_offset > 0);
  // Not reading stdout on purpose, for longer than a lossy process needs to write it all.
  await new Promise((r) => setTimeout(r, 500));
  const held = await l.process(p.id);
  assert.equal(held.state, "running", "a lossless viewer that does not read let the process end");
  assert.ok(held.output_offset < total, `process wrote ${held.output_offset} of ${total} bytes unread`);
  const hash = createHash("sha256");
  let got = 0;
  p.stdout.on("data", (b: Buffer) => {
    hash.update(b);
    got += b.length;
  });
  p.stderr.resume();
  const st = await p.wait();
  await finished(p.stdout);
  assert.equal(st.exit_code, 0);
  assert.equal(got, total);
  assert.equal(p.lost, 0);
  assert.equal(st.bytes_lost ?? 0, 0);
  const sum = await l.exec({ argv: ["sha256sum", "out"] });
  assert.equal(hash.digest("hex"), sum.stdout.split(" ")[0]);
  await l.release();
});

test("a PTY follows a resize", { timeout: 120_000 }, async () => {
  const l = await lease("pty");
  const p = await l.execStream({ argv: ["/bin/sh", "-c", "stty size; read x; stty size"], tty: true, stdin: true, rows: 24, cols: 80 });
  let out = "";
  p.stdout.on("data", (b: Buffer) => (out += b.toString()));
  await eventually("the first size", () => out.includes("24 80"));
  p.resize(50, 132);
  p.write("go\n");
  await eventually("the new size", () => out.includes("50 132"));
  const st = await p.wait();
  assert.equal(st.exit_code, 0);
  await l.release();
});

test("a streaming exec takes env and reports its exit", { timeout: 120_000 }, async () => {
  const l = await lease("stream-env");
  const p = await l.execStream({ argv: ["sh", "-c", 'printf %s "$GREETING"; exit 7'], env: { GREETING: "hi there" } });
  const out = await readAll(p.stdout);
  const st = await p.wait();
  assert.equal(out.toString(), "hi there");
  assert.equal(st.exit_code, 7);
  await l.release();
});

test("a shell session keeps cd and export, and runs one command at a time", { timeout: 120_000 }, async () => {
  const l = await lease("ts-shell");
  const sh = await l.newShell();
  const home = (await l.runShell(sh.id, "pwd; mkdir sub")).stdout.trimEnd();
  assert.equal((await l.runShell(sh.id, "cd sub && export A=1")).exit_code, 0);
  const res = await l.runShell(sh.id, "pwd; echo $A; exit_code() { return 4; }; exit_code");
  assert.equal(res.stdout, `${home}/sub\n1\n`);
  assert.equal(res.exit_code, 4);
  const slow = l.runShell(sh.id, "sleep 100", 1);
  await eventually("busy", async () => (await l.shell(sh.id)).busy);
  await assert.rejects(l.runShell(sh.id, "true"), ShellBusyError);
  assert.equal((await slow).timed_out, true);
  assert.equal((await l.shells()).length, 1);
  await l.closeShell(sh.id);
  await assert.rejects(l.shell(sh.id), ShellNotFoundError);
  await l.release();
});

test("a worker holding only the lease token works with it", { timeout: 120_000 }, async () => {
  const owner = await lease("worker");
  const worker = d.client.openLease(owner.id, owner.token!);
  const res = await worker.exec({ argv: ["echo", "from the worker"] });
  assert.equal(res.stdout, "from the worker\n");
  await owner.release();
});

test("the daemon keeps a lease's usage history, a sample every 10 s", { timeout: 120_000 }, async () => {
  const l = await lease("ts-usage-history");
  let h = await d.client.usageHistory(l.id);
  assert.equal(h.interval_seconds, 10);
  await eventually("a usage sample", async () => (h = await d.client.usageHistory(l.id)).samples.length > 0);
  const s = h.samples[h.samples.length - 1];
  assert.ok(Date.parse(s.at) > 0 && s.memory_bytes >= 0 && s.cpu_seconds >= 0 && s.pids >= 0, JSON.stringify(s));
  await l.release();
});

test("connection errors name the setting that fixes them", { timeout: 60_000 }, async () => {
  const untrusted = new Client({ url: d.url, token: d.token });
  await assert.rejects(untrusted.info(), (err: Error) => {
    assert.match(err.message, /SANDBOX_REMOTE_CA_FILE/);
    return true;
  });
  untrusted.close();
  const otherHost = new Client({ url: d.url, token: d.token, ca: d.ca, servername: "not-in-the-certificate.example" });
  await assert.rejects(otherHost.info(), (err: Error) => {
    assert.match(err.message, /SIDECAR_TLS_HOSTS/);
    return true;
  });
  otherHost.close();
  const srv = createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const port = (srv.address() as AddressInfo).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  const refused = new Client({ url: `https://127.0.0.1:${port}`, token: d.token, ca: d.ca });
  await assert.rejects(refused.info(), (err: NodeJS.ErrnoException) => {
    assert.equal(err.code, "ECONNREFUSED");
    assert.match(err.message, /SANDBOX_REMOTE_URL/);
    return true;
  });
  refused.close();
});
