// Several sidecars behind one Client, the same semantics as the Go client's fleet
// (client/fleet.go; docs/operations.md section 14):
//
//   - A new lease: the session's existing lease is looked for first on every sidecar
//     (GET /v1/leases?session_id=), so a session never gets a second sandbox elsewhere.
//     Else the two sidecars ranking highest for the session id by rendezvous hashing
//     (FNV-1a 64 of session, a 0 byte, the sidecar's URL: the Go client's hash, so both
//     clients pick the same two) are asked for /v1/info, and the one with more room (the
//     tighter of free lease slots and memory headroom, as fractions) takes it: the power
//     of two choices. One draining, full or unreachable is skipped and the next tried.
//   - A handle from acquire holds its sidecar's Client. A lease named by id alone is
//     found in this Client's map of the leases it has seen, else by asking every sidecar
//     once (GET /v1/leases/{id}).
//   - List and cleanup cover every sidecar; those that do not answer are named in a
//     FleetError that carries the others' results.
import { lookup as dnsLookup } from "node:dns/promises";
import { isIP } from "node:net";
import type { components } from "./openapi.js";
import { SidecarError, DrainingError, LeaseLimitError, LeaseNotFoundError, UnauthorizedError } from "./errors.js";

type Schemas = components["schemas"];
type Lease = Schemas["Lease"];
type Info = Schemas["Info"];

/** The few Client calls a fleet makes on one sidecar (Client implements it). */
export interface MemberClient {
  readonly base: URL;
  info(): Promise<Info>;
  json<T>(c: { method: string; path: string; query?: Record<string, string>; token?: string; timeoutMs?: number }): Promise<T>;
  close(): void;
}

export interface Member<C extends MemberClient = MemberClient> {
  /** The sidecar's URL as the Go client spells it (its rendezvous hash input). */
  readonly url: string;
  readonly client: C;
  downUntil: number; // skipped for new leases until then (ms since the epoch)
}

/** A fleet call some sidecars did not answer: errors name each one (their `sidecar`),
 * partial holds what the others returned. */
export class FleetError<T = undefined> extends AggregateError {
  readonly partial: T;
  constructor(message: string, errors: Error[], partial: T) {
    super(errors, `${message}: ${errors.map((e) => e.message).join("; ")}`);
    this.name = "FleetError";
    this.partial = partial;
  }
}

/** FLEET_RESOLVE_EVERY_MS: how stale the addresses of a DNS fleet may get. */
export const FLEET_RESOLVE_EVERY_MS = 30_000;
/** FLEET_DOWN_FOR_MS: a sidecar that did not answer is left out of placement this long. */
export const FLEET_DOWN_FOR_MS = 5_000;
/** FLEET_PROBE_TIMEOUT_MS bounds each capacity, session and lease look-up on one sidecar
 * (an idle socket that long fails the look-up). */
export const FLEET_PROBE_TIMEOUT_MS = 10_000;
/** FLEET_LEASE_MAP bounds the map of leases seen; past it the map starts over (a miss
 * costs one look-up on every sidecar, never a wrong answer). */
export const FLEET_LEASE_MAP = 100_000;

/** isFleet says whether a config names several sidecars. */
export function isFleet(url: string | string[], discovery?: string): boolean {
  return discovery === "dns" || splitURLs(url).length > 1;
}

/** splitURLs is the list a config's url names: an array, comma-separated lists, or both. */
export function splitURLs(url: string | string[]): string[] {
  return (Array.isArray(url) ? url : [url]).flatMap((u) => u.split(",")).map((u) => u.trim());
}

/** memberURL is a sidecar's URL as the Go client's url.URL.String() gives it for the
 * usual https://host:port[/path] (trimmed, no trailing slash, scheme lower case): the
 * rendezvous hash input, so that Go and TypeScript clients rank sidecars alike. */
export function memberURL(raw: string): string {
  const s = raw.trim().replace(/\/+$/, "");
  if (!/^https:\/\//i.test(s)) throw new Error(`client: URL must be https://host[:port] (in the list: ${raw})`);
  if (new URL(s).host === "") throw new Error(`client: URL has no host (in the list: ${raw})`);
  return "https" + s.slice(5);
}

const fnvOffset = 0xcbf29ce484222325n;
const fnvPrime = 0x100000001b3n;
const mask64 = 0xffffffffffffffffn;

/** fnv1a64 is FNV-1a, 64 bits (Go's hash/fnv New64a). */
export function fnv1a64(data: Uint8Array, h = fnvOffset): bigint {
  for (const b of data) h = ((h ^ BigInt(b)) * fnvPrime) & mask64;
  return h;
}

/** rank is the rendezvous hash of a session on a sidecar, the Go client's rank(). */
export function rank(session: string, member: string): bigint {
  const enc = new TextEncoder();
  let h = fnv1a64(enc.encode(session));
  h = fnv1a64(new Uint8Array([0]), h);
  return fnv1a64(enc.encode(member), h);
}

/** room is the free fraction of a sidecar, the tighter of its lease slots and its memory
 * headroom: 1 empty, 0 full. A sidecar that reports no memory figure is weighed by slots. */
export function room(c: Schemas["Capacity"], maxLeases: number): number {
  let r = 1;
  if (maxLeases > 0) r = c.free_leases / maxLeases;
  if (c.memory_bytes > 0) r = Math.min(r, c.memory_headroom_bytes / c.memory_bytes);
  return r;
}

/** skippable: the sidecar cannot take this new lease, another may. */
export function skippable(err: unknown): boolean {
  if (!(err instanceof SidecarError)) return !(err instanceof Error && err.name === "AbortError");
  return ["draining", "lease_limit", "unavailable", "quota_exceeded", "internal"].includes(err.code);
}

/** named prefixes an error with its sidecar (kept as `sidecar` on the error). */
function named(url: string, err: unknown): Error {
  const e = err instanceof Error ? err : new Error(String(err));
  if (!e.message.startsWith(url + ": ")) e.message = `${url}: ${e.message}`;
  (e as Error & { sidecar?: string }).sidecar = url;
  return e;
}

export interface FleetOptions {
  /** Discovery "dns": the one URL's host is a name whose every address is a sidecar. */
  discovery?: "dns";
  /** Resolves the name for DNS discovery; the system resolver when absent. */
  lookup?: (host: string) => Promise<string[]>;
  /** Receives the fleet's warnings (a sidecar skipped, a resolution failed). */
  log?: (msg: string) => void;
}

export class Fleet<C extends MemberClient> {
  members: Member<C>[] = [];
  private readonly leases = new Map<string, Member<C>>();
  private readonly make: (url: string, servername?: string) => C;
  private readonly lookup: (host: string) => Promise<string[]>;
  private readonly log: (msg: string) => void;
  private dnsName = "";
  private dnsPort = "";
  private resolvedAt = 0;
  private next = 0;

  constructor(urls: string | string[], make: (url: string, servername?: string) => C, opts: FleetOptions = {}) {
    this.make = make;
    this.lookup = opts.lookup ?? (async (host) => (await dnsLookup(host, { all: true })).map((a) => a.address));
    this.log = opts.log ?? (() => undefined);
    const list = splitURLs(urls);
    if (opts.discovery === "dns") {
      if (list.length !== 1) throw new Error("client: DNS discovery takes one URL, not a list");
      const u = new URL(memberURL(list[0]));
      this.dnsName = u.hostname;
      this.dnsPort = u.port || "443";
      if (isIP(this.dnsName.replace(/^\[|\]$/g, "")) !== 0) {
        throw new Error(`client: DNS discovery needs a name, not the address ${this.dnsName}`);
      }
      return; // resolved at first use: a name briefly unknown must not fail start-up
    }
    for (const raw of list) {
      if (raw === "") continue;
      this.add(raw);
    }
    if (this.members.length === 0) throw new Error("client: the URL list names no sidecar");
  }

  private add(raw: string, servername?: string): void {
    const url = memberURL(raw);
    if (this.members.some((m) => m.url === url)) throw new Error(`client: ${raw} is in the list twice`);
    this.members.push({ url, client: this.make(url, servername), downUntil: 0 });
  }

  /** current is the member list, DNS resolved again when stale; a failed resolution
   * keeps the previous addresses. */
  async current(): Promise<Member<C>[]> {
    if (this.dnsName === "" || (Date.now() - this.resolvedAt < FLEET_RESOLVE_EVERY_MS && this.members.length > 0)) {
      return [...this.members];
    }
    let addrs: string[] = [];
    let err: unknown;
    try {
      addrs = await withTimeout(this.lookup(this.dnsName), FLEET_PROBE_TIMEOUT_MS);
    } catch (e) {
      err = e;
    }
    if (addrs.length === 0) {
      if (this.members.length > 0) {
        this.log(`fleet: resolving ${this.dnsName} failed (${err}); keeping the previous sidecars`);
        return [...this.members];
      }
      throw new Error(`client: resolve ${this.dnsName}: ${err ?? "no address"} (no sidecar known)`);
    }
    const old = this.members;
    this.members = [];
    for (const a of [...new Set(addrs)].sort()) {
      const url = `https://${isIP(a) === 6 ? `[${a}]` : a}:${this.dnsPort}`;
      const kept = old.find((m) => m.url === url);
      if (kept) this.members.push(kept); // its connections and down mark
      else this.add(url, this.dnsName);
    }
    for (const m of old) if (!this.members.includes(m)) m.client.close();
    this.resolvedAt = Date.now();
    return [...this.members];
  }

  up(m: Member<C>): boolean {
    return Date.now() >= m.downUntil;
  }

  /** failed notes a call to m that got no answer: m is left out of placement for a
   * while. An error reply (draining, full) is an answer and leaves it in. */
  failed(m: Member<C>, err: unknown): void {
    if (err instanceof SidecarError) return;
    m.downUntil = Date.now() + FLEET_DOWN_FOR_MS;
    this.log(`fleet: sidecar ${m.url} did not answer (${err}); skipped for new leases for a while`);
  }

  remember(id: string, m: Member<C>): void {
    if (this.leases.size >= FLEET_LEASE_MAP) this.leases.clear();
    this.leases.set(id, m);
  }

  forget(id: string): void {
    this.leases.delete(id);
  }

  /** place runs take on the sidecar this session's new lease belongs on: its existing
   * lease's, else the better of two choices; a skippable failure tries the next. */
  async place<T>(session: string, take: (m: Member<C>) => Promise<T>): Promise<T> {
    const members = await this.current();
    const errs: Error[] = [];
    const tried = new Set<Member<C>>();
    const attempt = async (m: Member<C>): Promise<{ done: boolean; v?: T }> => {
      tried.add(m);
      try {
        return { done: true, v: await take(m) };
      } catch (err) {
        this.failed(m, err);
        if (!skippable(err)) throw err;
        errs.push(named(m.url, err));
        return { done: false };
      }
    };
    // The session's lease where it lives: a draining sidecar still returns it.
    const home = await this.findSession(members, session);
    if (home) {
      const r = await attempt(home);
      if (r.done) return r.v as T;
    }
    for (;;) {
      const m = await this.choose(members, session, tried, errs);
      if (!m) break;
      const r = await attempt(m);
      if (r.done) return r.v as T;
    }
    if (errs.length === 0) throw new Error("client: no sidecar can take a new lease (all skipped for not answering)");
    throw new FleetError("client: no sidecar took the lease", errs, undefined);
  }

  /** findSession is the member holding an active lease of session, if one answers so. */
  private async findSession(members: Member<C>[], session: string): Promise<Member<C> | undefined> {
    const hits = await Promise.all(members.map(async (m) => {
      if (!this.up(m)) return undefined;
      try {
        const list = await m.client.json<Schemas["LeaseList"]>({ method: "GET", path: "/v1/leases", query: { session_id: session }, timeoutMs: FLEET_PROBE_TIMEOUT_MS });
        // A daemon before the filter lists them all.
        return list.leases.some((l) => l.session_id === session && l.state === "active") ? m : undefined;
      } catch (err) {
        this.failed(m, err);
        return undefined;
      }
    }));
    return hits.find((m) => m !== undefined);
  }

  /** choose picks, among the members not tried and not down, the two ranking highest for
   * session and returns the one with more room; a candidate draining, full or silent is
   * marked tried (its reason in errs) and the choice made again. */
  private async choose(members: Member<C>[], session: string, tried: Set<Member<C>>, errs: Error[]): Promise<Member<C> | undefined> {
    for (;;) {
      const cands = members.filter((m) => !tried.has(m) && this.up(m))
        .sort((a, b) => cmp(rank(session, b.url), rank(session, a.url)))
        .slice(0, 2);
      if (cands.length === 0) return undefined;
      const scored = await Promise.all(cands.map(async (m) => {
        let err: Error;
        try {
          const info = await m.client.json<Info>({ method: "GET", path: "/v1/info", timeoutMs: FLEET_PROBE_TIMEOUT_MS });
          // A daemon before capacity reports none: the Go client reads that as no free slot.
          const capacity = info.capacity ?? { active_leases: 0, free_leases: 0, memory_bytes: 0, memory_committed_bytes: 0, memory_headroom_bytes: 0 };
          if (info.draining) err = new DrainingError(503, { code: "draining", title: "the sidecar is draining" });
          else if (capacity.free_leases <= 0 && info.limits.max_leases > 0) err = new LeaseLimitError(429, { code: "lease_limit", title: "the sidecar has no free lease slot" });
          else return { m, score: room(capacity, info.limits.max_leases) };
        } catch (e) {
          this.failed(m, e);
          err = e as Error;
        }
        tried.add(m);
        errs.push(named(m.url, err));
        return undefined;
      }));
      let best: { m: Member<C>; score: number } | undefined;
      for (const s of scored) {
        if (!s) continue;
        if (!best || s.score > best.score || (s.score === best.score && rank(session, s.m.url) > rank(session, best.m.url))) best = s;
      }
      if (best) return best.m;
    }
  }

  /** locate is the member holding lease id, asked with token (undefined: the shared one):
   * the map, else every member at once. LeaseNotFoundError when none has it; a FleetError
   * when it may live on one that did not answer. */
  async locate(id: string, token?: string): Promise<Member<C>> {
    const known = this.leases.get(id);
    if (known) return known;
    const members = await this.current();
    const errs: Error[] = [];
    const hits = await Promise.all(members.map(async (m) => {
      try {
        await m.client.json<Lease>({ method: "GET", path: `/v1/leases/${encodeURIComponent(id)}`, token, timeoutMs: FLEET_PROBE_TIMEOUT_MS });
        return m;
      } catch (err) {
        if (!(err instanceof LeaseNotFoundError) && !(err instanceof UnauthorizedError)) errs.push(named(m.url, err));
        return undefined;
      }
    }));
    const m = hits.find((h) => h !== undefined);
    if (m) {
      this.remember(id, m);
      return m;
    }
    if (errs.length > 0) throw new FleetError(`client: lease ${id} not found on the sidecars that answered`, errs, undefined);
    throw new LeaseNotFoundError(404, { code: "lease_not_found", title: "lease not found", detail: `lease ${id} is on no sidecar` });
  }

  /** each runs fn on every member at once: the results of those that answered, and the
   * errors of the others, each naming its sidecar. */
  async each<T>(fn: (m: Member<C>) => Promise<T>): Promise<{ results: T[]; errors: Error[] }> {
    const members = await this.current();
    const out = await Promise.allSettled(members.map(fn));
    const results: T[] = [];
    const errors: Error[] = [];
    out.forEach((r, i) => {
      if (r.status === "fulfilled") results.push(r.value);
      else errors.push(named(members[i].url, r.reason));
    });
    return { results, errors };
  }

  /** any runs fn on one member that answers, round robin, the next on no answer. */
  async any<T>(fn: (m: Member<C>) => Promise<T>): Promise<T> {
    const members = await this.current();
    const start = this.next++;
    const errs: Error[] = [];
    for (let i = 0; i < members.length; i++) {
      const m = members[(start + i) % members.length];
      if (!this.up(m) && i < members.length - 1) continue;
      try {
        return await fn(m);
      } catch (err) {
        if (err instanceof SidecarError) throw err;
        this.failed(m, err);
        errs.push(named(m.url, err));
      }
    }
    throw new FleetError("client: no sidecar answered", errs, undefined);
  }

  close(): void {
    for (const m of this.members) m.client.close();
  }
}

function cmp(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms).unref();
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}
