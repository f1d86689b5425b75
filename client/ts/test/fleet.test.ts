// The TypeScript client against three real daemons behind one fleet config: the hash is
// the Go client's, placement spreads by capacity, a drained sidecar gets no new lease
// while its own lease works on, a killed one is skipped, a lease opened by id is found
// on its sidecar. The Go side of the same: client/fleet.go, internal/daemon/fault_fleet_test.go.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import {
  Client, configFromEnv, FleetError, LeaseNotFoundError, DrainingError, readAll,
  rank, fnv1a64, memberURL, room, type LeaseHandle,
} from "../src/index.js";
import { startDaemon, sidecarBin, type Daemon } from "./daemon.js";

const token = randomBytes(32).toString("base64url");
// Twelve slots and 12 GiB of lease memory each (1 GiB a lease): room falls by 1/12 a lease.
const limits = {
  SIDECAR_MAX_LEASES: "12",
  SIDECAR_CAPACITY_MEMORY_BYTES: String(12 * 2 ** 30),
  SIDECAR_DEFAULT_LIMITS_MEMORY_BYTES: String(2 ** 30),
  SIDECAR_DISK_QUOTA: "off",
};
const certName = "sidecar.fleet.test"; // in the certificate, for DNS discovery
let ds: Daemon[] = [];
let ca: Buffer;
let tlsDir = "";

before(async () => {
  // One CA for the fleet, as deployed: Node (OpenSSL) cannot trust several self-signed
  // certificates of one subject (every SIDECAR_TLS_SELF_SIGNED one is O=sidecar,
  // CN=localhost) at once; it tries the first it finds by subject only.
  tlsDir = mkdtempSync("/var/tmp/sidecar-ts-fleet-tls-");
  execFileSync(sidecarBin(), ["tls", "gen", "--dir", tlsDir, "--host", "localhost", "--host", certName, "--ip", "127.0.0.1"], { stdio: "ignore" });
  ca = readFileSync(join(tlsDir, "ca.crt"));
  ds = await Promise.all([0, 1, 2].map((index) => startDaemon({ index, token, env: limits, tlsDir })));
});
after(async () => {
  for (const d of ds) await d.stop();
  if (tlsDir) rmSync(tlsDir, { recursive: true, force: true });
});

const urls = () => ds.map((d) => d.url);
const fleet = (log?: (m: string) => void) => new Client({ url: urls(), token, ca, log });

/** on is the index of the daemon holding lease id, asking each directly (-1: none). */
async function on(id: string): Promise<number> {
  for (let i = 0; i < ds.length; i++) {
    if (await ds[i].client.getLease(id).then(() => true, () => false)) return i;
  }
  return -1;
}

async function releaseAll(hs: LeaseHandle[]): Promise<void> {
  for (const h of hs) await h.release().catch(() => undefined);
}

test("the rendezvous hash is the Go client's (client/fleet_rank_test.go's vectors)", () => {
  // FNV-1a 64 itself: the published vectors.
  assert.equal(fnv1a64(new Uint8Array()), 0xcbf29ce484222325n);
  assert.equal(fnv1a64(new TextEncoder().encode("a")), 0xaf63dc4c8601ec8cn);
  const vectors: [string, string, bigint][] = [
    ["session-1", "https://127.0.0.1:7443", 0x2df69e4a598e24dfn],
    ["session-1", "https://10.0.0.2:7443", 0xd4b2c46889c5a61fn],
    ["session-1", "https://sidecar-2.sidecar.ns.svc:7443", 0xa5185e5aa6c88dcen],
    ["s2", "https://127.0.0.1:7443", 0x69a201c0ab312488n],
    ["s2", "https://10.0.0.2:7443", 0x04de91e3f5c35f06n],
    ["s2", "https://sidecar-2.sidecar.ns.svc:7443", 0x6454b8f85ac631f7n],
    ["日本", "https://127.0.0.1:7443", 0x28ac21850210d9f3n],
    ["日本", "https://10.0.0.2:7443", 0x0c758be8a3de76f3n],
    ["日本", "https://sidecar-2.sidecar.ns.svc:7443", 0x23e6a8552c81736an],
  ];
  for (const [s, m, want] of vectors) assert.equal(rank(s, m), want, `rank(${s}, ${m})`);
  // The string hashed is the URL as the Go client spells it.
  assert.equal(memberURL(" https://127.0.0.1:7443/ "), "https://127.0.0.1:7443");
  assert.equal(memberURL("HTTPS://Sidecar-B:7443//"), "https://Sidecar-B:7443");
  // Room: the tighter of slots and memory.
  const cap = { active_leases: 3, free_leases: 9, memory_bytes: 100, memory_committed_bytes: 50, memory_headroom_bytes: 50 };
  assert.equal(room(cap, 12), 0.5);
  assert.equal(room({ ...cap, memory_bytes: 0 }, 12), 0.75);
});

test("a URL list or an array makes a fleet; one URL stays the plain client", async () => {
  const base = { SANDBOX_REMOTE_AUTH_TOKEN: token };
  const cfg = configFromEnv({ ...base, SANDBOX_REMOTE_URL: urls().join(" , ") });
  const c = new Client({ ...cfg, ca });
  assert.deepEqual((await c.sidecars()).map((s) => s.base.origin), ds.map((d) => new URL(d.url).origin));
  c.close();
  const one = new Client({ url: [ds[0].url], token, ca });
  assert.deepEqual(await one.sidecars(), [one]);
  assert.equal((await one.drain(false)).draining, false); // the plain client drains its daemon
  one.close();
  await assert.rejects(fleet().drain(true), /names one sidecar/);
  for (const [env, want] of [
    [{ SANDBOX_REMOTE_URL: "https://a:1,http://b:2" }, /https:\/\/ URL/],
    [{ SANDBOX_REMOTE_URL: "https://a:1,,https://b:2" }, /empty entry/],
    [{ SANDBOX_REMOTE_URL: "https://a:1,https://b:2", SANDBOX_REMOTE_DISCOVERY: "dns" }, /takes one URL/],
    [{ SANDBOX_REMOTE_URL: "https://a:1", SANDBOX_REMOTE_DISCOVERY: "consul" }, /SANDBOX_REMOTE_DISCOVERY/],
  ] as const) {
    assert.throws(() => configFromEnv({ ...base, ...env }), want);
  }
  assert.throws(() => new Client({ url: "https://a:1,https://a:1/", token }), /twice/);
  assert.throws(() => new Client({ url: "https://127.0.0.1:1", discovery: "dns", token }), /needs a name/);
});

test("placement spreads sessions by capacity and a session stays on its sidecar", { timeout: 120_000 }, async () => {
  const fc = fleet();
  const hs: LeaseHandle[] = [];
  try {
    for (let i = 0; i < 12; i++) hs.push(await fc.acquire({ session_id: `spread-${i}` }));
    const where = await Promise.all(hs.map((h) => on(h.id)));
    const counts = [0, 1, 2].map((i) => where.filter((w) => w === i).length);
    // The stated bound: with 12 sessions on 3 equal sidecars, none gets fewer than 2 or
    // more than 6 (one choice by hash alone would leave this to chance).
    assert.ok(Math.min(...counts) >= 2 && Math.max(...counts) <= 6, `leases per sidecar ${counts}`);
    for (const [i, h] of hs.entries()) {
      assert.equal(h.client.base.origin, new URL(ds[where[i]].url).origin, "the handle holds its sidecar");
      assert.equal((await h.exec({ argv: ["echo", "ok"] })).stdout, "ok\n");
    }
    // The session's lease comes back, also to another client (another process): it asks
    // every sidecar for the session before placing.
    const fc2 = fleet();
    for (const i of [0, 5, 11]) {
      const again = await fc2.acquire({ session_id: `spread-${i}` });
      again.stopRenewing();
      assert.equal(again.id, hs[i].id);
    }
    fc2.close();
  } finally {
    await releaseAll(hs);
    fc.close();
  }
});

test("a lease opened by id alone is found on its sidecar", { timeout: 120_000 }, async () => {
  const fc = fleet();
  const hs: LeaseHandle[] = [];
  try {
    for (let i = 0; i < 3; i++) hs.push(await ds[i].client.acquire({ session_id: `byid-${i}` }));
    for (const [i, h] of hs.entries()) {
      const worker = fleet(); // knows no lease: one GET on every sidecar
      const w = worker.openLease(h.id, h.token!);
      assert.equal((await w.exec({ argv: ["sh", "-c", "echo $PWD"] })).stdout, "/workspace\n");
      assert.equal(w.client.base.origin, new URL(ds[i].url).origin);
      // The websocket path too, on a handle whose sidecar is not known yet.
      const w2 = fleet().openLease(h.id, h.token!);
      const p = await w2.execStream({ argv: ["echo", "streamed"] });
      const [out, st] = await Promise.all([readAll(p.stdout), p.wait()]);
      assert.equal(out.toString(), "streamed\n");
      assert.equal(st.exit_code, 0);
      assert.equal((await worker.getLease(h.id)).session_id, `byid-${i}`);
      worker.close();
    }
    const listed = (await fc.listLeases()).map((l) => l.id);
    for (const h of hs) assert.ok(listed.includes(h.id), `${h.id} listed`);
    await assert.rejects(fc.getLease("lnosuchlease"), LeaseNotFoundError);
    await fc.releaseLease(hs[1].id);
    assert.equal(await on(hs[1].id), -1, "released on its sidecar");
  } finally {
    await releaseAll(hs);
    fc.close();
  }
});

test("DNS discovery dials each address with the name as TLS server name", { timeout: 120_000 }, async () => {
  const port = new URL(ds[0].url).port;
  const looked: string[] = [];
  const lookup = async (host: string) => {
    looked.push(host);
    return ["127.0.0.1", "127.0.0.1"]; // duplicates are one sidecar
  };
  const c = new Client({ url: `https://${certName}:${port}`, discovery: "dns", lookup, token, ca });
  const members = await c.sidecars();
  assert.deepEqual(members.map((m) => [m.base.origin, m.servername]), [[`https://127.0.0.1:${port}`, certName]]);
  assert.deepEqual(looked, [certName]);
  const h = await c.acquire({ session_id: "dns-1" });
  try {
    const p = await h.execStream({ argv: ["echo", "via-name"] });
    assert.equal((await readAll(p.stdout)).toString(), "via-name\n");
  } finally {
    await h.release();
    c.close();
  }
  // A name the certificate does not hold fails the handshake: the name is what is verified.
  const wrong = new Client({ url: `https://other.fleet.test:${port}`, discovery: "dns", lookup, token, ca });
  await assert.rejects(wrong.acquire({ session_id: "dns-2" }), /no sidecar/);
  wrong.close();
});

test("a drained sidecar gets no new lease while its own lease works on", { timeout: 120_000 }, async () => {
  const kept = await ds[0].client.acquire({ session_id: "drain-kept" });
  const fc = fleet();
  const hs: LeaseHandle[] = [];
  assert.equal((await ds[0].client.drain(true)).draining, true);
  try {
    for (let i = 0; i < 6; i++) hs.push(await fc.acquire({ session_id: `drained-${i}` }));
    const where = await Promise.all(hs.map((h) => on(h.id)));
    assert.ok(!where.includes(0), `new leases on ${where}: none may be on the drained sidecar`);
    assert.ok(!where.includes(-1));
    assert.equal((await kept.exec({ argv: ["echo", "still"] })).stdout, "still\n");
    // The session's lease is found on the drained sidecar, not placed again elsewhere.
    const again = await fc.acquire({ session_id: "drain-kept" });
    hs.push(again);
    assert.equal(again.id, kept.id);
    // Every sidecar draining: the error names each, all of them drains.
    await ds[1].client.drain(true);
    await ds[2].client.drain(true);
    await assert.rejects(fc.acquire({ session_id: "drained-none" }), (err: unknown) => {
      assert.ok(err instanceof FleetError, `got ${err}`);
      assert.equal(err.errors.length, 3);
      assert.ok(err.errors.every((e) => e instanceof DrainingError), err.message);
      return true;
    });
  } finally {
    for (const d of ds) await d.client.drain(false);
    await releaseAll([...hs, kept]);
    fc.close();
  }
});

test("a killed sidecar is skipped and named; the leases on the others run on", { timeout: 120_000 }, async () => {
  const survivors = [await ds[0].client.acquire({ session_id: "kill-0" }), await ds[1].client.acquire({ session_id: "kill-1" })];
  const logs: string[] = [];
  const fc = fleet((m) => logs.push(m));
  const hs: LeaseHandle[] = [];
  const dead = memberURL(ds[2].url);
  try {
    assert.equal((await ds[2].client.listLeases()).length, 0, "nothing of a lease is left behind by the kill");
    await ds[2].kill();
    for (let i = 0; i < 6; i++) hs.push(await fc.acquire({ session_id: `after-kill-${i}` }));
    const where = await Promise.all(hs.map((h) => on(h.id)));
    assert.ok(where.every((w) => w === 0 || w === 1), `placed on ${where}`);
    assert.ok(logs.some((m) => m.includes(dead)), `the dead sidecar was tried and skipped: ${logs}`);
    for (const l of [...survivors, ...hs]) assert.equal((await l.exec({ argv: ["echo", "on"] })).stdout, "on\n");
    await assert.rejects(fc.listLeases(), (err: unknown) => {
      assert.ok(err instanceof FleetError && err.message.includes(dead), `got ${err}`);
      const ids = (err.partial as { id: string }[]).map((l) => l.id);
      for (const l of [...survivors, ...hs]) assert.ok(ids.includes(l.id), `${l.id} in the partial list`);
      return true;
    });
    await assert.rejects(fc.cleanup(), (err: unknown) => err instanceof FleetError && err.message.includes(dead));
    // Not found on those that answered: it may live on the dead one, so no not-found.
    await assert.rejects(fc.getLease("lnosuchlease"), (err: unknown) => err instanceof FleetError && !(err instanceof LeaseNotFoundError));
    assert.equal(typeof (await fc.info()).version, "string");
  } finally {
    await releaseAll([...hs, ...survivors]);
    fc.close();
  }
});
