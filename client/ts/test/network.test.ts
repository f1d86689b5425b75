// The lease network through the TypeScript client against the real daemon: a policy at
// acquire and replaced (refused with a lease token), a TCP stream both ways over the
// port-forward websocket, and HTTP to a lease port through the ports route.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import type { Duplex } from "node:stream";
import {
  ForbiddenError, InvalidNetworkPolicyError, PortUnreachableError, readAll, Client, type LeaseHandle,
} from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

const root = process.getuid?.() === 0;
let d: Daemon;
before(async () => {
  d = await startDaemon();
});
after(async () => {
  await d?.stop();
});

// A TCP echo server on 127.0.0.1:PORT in the lease, one connection at a time; "bye" closes.
const echoServer = `
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
while True:
    c, _ = s.accept()
    while True:
        b = c.recv(65536)
        if not b or b.strip() == b"bye":
            break
        c.sendall(b)
    c.close()
`;

async function until<T>(what: string, attempt: () => Promise<T>, retry: (err: unknown) => boolean): Promise<T> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      return await attempt();
    } catch (err) {
      if (!retry(err) || Date.now() > deadline) throw new Error(`${what}: ${err}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

// readN reads exactly n bytes from s.
async function readN(s: Duplex, n: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let got = 0;
  while (got < n) {
    const chunk = s.read() as Buffer | null;
    if (chunk) {
      chunks.push(chunk);
      got += chunk.length;
      continue;
    }
    await new Promise<void>((resolve, reject) => {
      const done = () => { s.off("readable", done); s.off("end", ended); s.off("error", reject); resolve(); };
      const ended = () => reject(new Error(`stream ended after ${got} of ${n} bytes`));
      s.once("readable", done).once("end", ended).once("error", reject);
    });
  }
  return Buffer.concat(chunks);
}

async function startBackground(l: LeaseHandle, argv: string[]): Promise<void> {
  const p = await l.start({ argv });
  p.close(); // the process runs on; this handle does not watch it
}

test("a policy at acquire, replaced with the shared token, refused with the lease's", { timeout: 120_000 }, async () => {
  const l = await d.client.acquire({ session_id: "ts-net-policy", network: { egress: "allowlist", allow_out: ["pypi.org", "*.pythonhosted.org:443"] } });
  try {
    assert.equal(l.info.network.egress, "allowlist");
    assert.deepEqual(l.info.network.allow_out, ["pypi.org", "*.pythonhosted.org:443"]);
    if (root) assert.ok(l.info.network_stats, "a lease in its own namespace has network_stats");
    const replaced = await l.setNetwork({ egress: "internet", deny_out: ["203.0.113.0/24"] });
    assert.equal(replaced.network.egress, "internet");
    assert.deepEqual(replaced.network.deny_out, ["203.0.113.0/24"]);
    assert.equal((await d.client.setNetwork(l.id, "none")).network.egress, "none");
    const worker = new Client({ url: d.url, token: l.token!, ca: d.ca });
    try {
      await assert.rejects(worker.openLease(l.id, l.token!).setNetwork({ egress: "internet" }), (err: unknown) => {
        assert.ok(err instanceof ForbiddenError, `got ${err}`);
        assert.equal(err.status, 403);
        return true;
      });
    } finally {
      worker.close();
    }
    assert.equal((await l.get()).network.egress, "none");
    await assert.rejects(l.setNetwork({ egress: "allowlist", allow_out: ["10.1.2.3"] }), InvalidNetworkPolicyError);
  } finally {
    await l.release();
  }
});

test("portForward carries a TCP stream both ways; portRequest reaches an HTTP server", { timeout: 120_000, skip: !root && "ports need a network namespace per lease (root)" }, async () => {
  const l = await d.client.acquire({ session_id: "ts-net-ports" });
  const worker = new Client({ url: d.url, token: l.token!, ca: d.ca });
  const other = await d.client.acquire({ session_id: "ts-net-other" });
  const stranger = new Client({ url: d.url, token: other.token!, ca: d.ca });
  try {
    const byToken = worker.openLease(l.id, l.token!);
    await startBackground(l, ["python3", "-c", echoServer, "7000"]);
    const s = await until("the echo server", () => byToken.portForward(7000), (e) => e instanceof PortUnreachableError);
    for (const msg of ["hello through the daemon\n", "x".repeat(200_000) + "\n"]) {
      s.write(msg);
      assert.equal((await readN(s, msg.length)).toString(), msg);
    }
    s.write("bye\n");
    await new Promise<void>((resolve, reject) => s.on("end", resolve).on("error", reject).resume());
    s.destroy();
    await assert.rejects(byToken.portForward(7001), PortUnreachableError);
    await assert.rejects(stranger.openLease(l.id, other.token!).portForward(7000), ForbiddenError);

    await l.writeFile("site/hello.txt", "served from the lease\n", { mkdirs: true });
    await startBackground(l, ["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "site", "8000"]);
    const res = await until("the http server", () => byToken.portRequest(8000, "/hello.txt"), (e) => e instanceof PortUnreachableError);
    assert.equal(res.statusCode, 200);
    assert.equal((await readAll(res)).toString(), "served from the lease\n");
    assert.match(await byToken.portURL(8000), new RegExp(`/v1/leases/${l.id}/ports/8000/$`));
    await assert.rejects(stranger.openLease(l.id, other.token!).portRequest(8000, "hello.txt"), ForbiddenError);
  } finally {
    worker.close();
    stranger.close();
    await other.release();
    await l.release();
  }
});
