// The HTTP side of the client: one Client per daemon, a LeaseHandle per lease.
import { readFileSync } from "node:fs";
import { request as httpsRequest, Agent } from "node:https";
import type { IncomingMessage, OutgoingHttpHeaders } from "node:http";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { components } from "./openapi.js";
import { errorFromReply, withHint, UnauthorizedError, ForbiddenError, LeaseNotFoundError, LeaseExpiredError } from "./errors.js";
import { Process, type ExecStreamOptions } from "./process.js";
import { dialPortForward } from "./portforward.js";
import type { Duplex } from "node:stream";
import { Fleet, FleetError, isFleet, splitURLs } from "./fleet.js";

export type Schemas = components["schemas"];
export type Lease = Schemas["Lease"];
export type UsageHistory = Schemas["UsageHistory"];
export type AcquireRequest = Schemas["AcquireRequest"];
export type ExecRequest = Schemas["ExecRequest"];
export type ExecResult = Schemas["ExecResult"];
export type StartRequest = Schemas["StartRequest"];
export type ProcessInfo = Schemas["Process"];
export type FileEntry = Schemas["FileEntry"];
export type DirListing = Schemas["DirListing"];
export type ArchiveStats = Schemas["ArchiveStats"];
export type Info = Schemas["Info"];
export type CleanupResult = Schemas["CleanupResult"];
export type DrainStatus = Schemas["DrainStatus"];
export type ScriptRequest = Schemas["ScriptRequest"];
export type ScriptResult = Schemas["ScriptResult"];
export type ShellCreateRequest = Schemas["ShellCreateRequest"];
export type ShellInfo = Schemas["Shell"];
export type ShellResult = Schemas["ShellResult"];
export type NetworkPolicy = Schemas["NetworkPolicy"];
export type NetworkStats = Schemas["NetworkStats"];
export type NetworkInfo = Schemas["NetworkInfo"];
export type ImageInfo = Schemas["ImageInfo"];
export type ImageList = Schemas["ImageList"];

export interface Config {
  /** https://host:port of the daemon. Several (an array, or a comma-separated list) make
   * a fleet (see fleet.ts): new leases are placed by capacity, each stays on its sidecar. */
  url: string | string[];
  /** The shared token, or a lease token (that lease's routes only). */
  token: string;
  /** PEM of the CA that signed the daemon's certificate (a fleet: the one CA of all its
   * sidecars, or several of distinct subjects concatenated); the system roots when absent. */
  ca?: string | Buffer;
  /** "dns": url's host is a name (a Kubernetes headless Service) and each address it
   * resolves to is a sidecar, spoken to with the name as TLS server name. Opt-in, since a
   * name with several addresses is as often one daemon (dual-stack localhost). */
  discovery?: "dns";
  /** Resolves the name for discovery "dns"; node:dns lookup (all addresses) when absent. */
  lookup?: (host: string) => Promise<string[]>;
  /** The TLS server name when it is not the URL's host (a DNS fleet's members). */
  servername?: string;
  /** Receives a fleet's warnings (a sidecar skipped, a resolution failed). */
  log?: (msg: string) => void;
}

/** configFromEnv reads SANDBOX_REMOTE_URL (one URL or a comma-separated list),
 * SANDBOX_REMOTE_DISCOVERY, SANDBOX_REMOTE_AUTH_TOKEN (or _FILE) and
 * SANDBOX_REMOTE_CA_FILE, naming every variable at fault. */
export function configFromEnv(env: NodeJS.ProcessEnv = process.env): Config {
  const problems: string[] = [];
  const url = env.SANDBOX_REMOTE_URL?.trim() ?? "";
  const list = url.split(",").map((u) => u.trim());
  if (url === "") problems.push("SANDBOX_REMOTE_URL is required");
  else if (list.includes("")) problems.push("SANDBOX_REMOTE_URL has an empty entry in its list");
  else if (!list.every((u) => u.startsWith("https://") && u.length > "https://".length)) {
    problems.push("SANDBOX_REMOTE_URL must be an https:// URL" + (list.length > 1 ? " (each one in its list)" : ""));
  }
  const discovery = env.SANDBOX_REMOTE_DISCOVERY?.trim() ?? "";
  if (discovery !== "" && discovery !== "dns") problems.push(`SANDBOX_REMOTE_DISCOVERY must be "dns" or unset (got ${JSON.stringify(discovery)})`);
  if (discovery === "dns" && list.length > 1) problems.push("SANDBOX_REMOTE_DISCOVERY=dns takes one URL (a name), not a list");
  let token = env.SANDBOX_REMOTE_AUTH_TOKEN?.trim() ?? "";
  const tokenFile = env.SANDBOX_REMOTE_AUTH_TOKEN_FILE?.trim();
  if (!token && tokenFile) token = readFileSync(tokenFile, "utf8").trim();
  if (!token) problems.push("SANDBOX_REMOTE_AUTH_TOKEN or SANDBOX_REMOTE_AUTH_TOKEN_FILE is required");
  const caFile = env.SANDBOX_REMOTE_CA_FILE?.trim();
  if (problems.length > 0) throw new Error("client configuration: " + problems.join("; "));
  return { url, token, ca: caFile ? readFileSync(caFile) : undefined, discovery: discovery === "dns" ? "dns" : undefined };
}

interface Call {
  method: string;
  path: string; // escaped, below the base URL
  query?: Record<string, string | string[]>;
  headers?: OutgoingHttpHeaders;
  json?: unknown;
  body?: Buffer | Readable;
  lease?: LeaseHandle; // whose credential the call uses; it keeps refreshed tokens
  token?: string; // instead of the client's token (a lease token, to look its lease up)
  timeoutMs?: number; // fails the call after a socket idle this long
}

/** The lease workdir's absolute name (lease processes see their workdir there). */
export const WORKSPACE = "/workspace";

/** escapePath escapes a workdir path (relative, or absolute under WORKSPACE, which it
 * keeps absolute) segment by segment; it refuses other absolute paths and escaping ones
 * before any request, as the daemon would. */
export function escapePath(p: string): string {
  if (p.includes("\0")) throw new Error("path contains NUL");
  let abs = "";
  if (p.startsWith("/")) {
    if (p !== WORKSPACE && !p.startsWith(WORKSPACE + "/"))
      throw new Error(`path ${JSON.stringify(p)} is absolute and not under ${WORKSPACE}`);
    abs = WORKSPACE;
    p = p.slice(WORKSPACE.length);
  }
  const segs: string[] = [];
  for (const s of p.split("/")) {
    if (s === "" || s === ".") continue;
    if (s === "..") {
      if (segs.length === 0) throw new Error(`path ${JSON.stringify(p)} leaves the workdir`);
      segs.pop();
      continue;
    }
    segs.push(s);
  }
  const rel = segs.map(encodeURIComponent).join("/");
  return abs === "" ? rel : rel === "" ? abs : `${abs}/${rel}`;
}

export class Client {
  /** The daemon's URL; on a fleet, the first one configured (no call goes there by
   * itself: each goes to its lease's sidecar, see sidecars). */
  readonly base: URL;
  readonly token: string;
  readonly ca?: string | Buffer;
  readonly servername?: string;
  readonly agent: Agent;
  /** Set when the config names several sidecars. */
  private readonly fleet?: Fleet<Client>;

  constructor(cfg: Config) {
    const urls = splitURLs(cfg.url).filter((u) => u !== "");
    if (urls.length === 0) throw new Error("client: the URL list names no sidecar");
    if (isFleet(cfg.url, cfg.discovery)) {
      this.fleet = new Fleet(cfg.url, (url, servername) => new Client({ ...cfg, url, discovery: undefined, servername }),
        { discovery: cfg.discovery, lookup: cfg.lookup, log: cfg.log });
    }
    this.base = new URL(urls[0].replace(/\/+$/, ""));
    if (this.base.protocol !== "https:") throw new Error("client: URL must be https://host[:port]");
    this.token = cfg.token;
    this.ca = cfg.ca;
    this.servername = cfg.servername;
    this.agent = new Agent({ keepAlive: true, ca: cfg.ca, maxSockets: 16, servername: cfg.servername });
  }

  /** sidecars are the clients of a fleet's sidecars (resolved for discovery "dns"); a
   * client of one daemon is its own only one. */
  async sidecars(): Promise<Client[]> {
    return this.fleet ? (await this.fleet.current()).map((m) => m.client) : [this];
  }

  /** close releases idle keep-alive connections. */
  close(): void {
    this.fleet?.close();
    this.agent.destroy();
  }

  /** send makes one request and resolves with a 2xx response whose body the caller
   * reads; an error reply rejects with its typed error. */
  send(c: Call): Promise<IncomingMessage> {
    if (this.fleet) return this.fleetSend(c);
    const url = new URL(this.base.toString());
    url.pathname = this.base.pathname.replace(/\/$/, "") + c.path;
    for (const [k, v] of Object.entries(c.query ?? {})) {
      for (const x of Array.isArray(v) ? v : [v]) url.searchParams.append(k, x);
    }
    const headers: OutgoingHttpHeaders = { ...c.headers };
    headers.authorization = `Bearer ${c.lease?.credential() || c.token || this.token}`;
    let body = c.body;
    if (c.json !== undefined) {
      body = Buffer.from(JSON.stringify(c.json));
      headers["content-type"] = "application/json";
    }
    if (Buffer.isBuffer(body)) headers["content-length"] = body.length;
    return new Promise((resolve, reject) => {
      const req = httpsRequest(url, { method: c.method, headers, agent: this.agent }, (res) => {
        const fresh = res.headers["x-lease-token"];
        if (typeof fresh === "string" && c.lease) c.lease.tokenRefreshed(fresh);
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) {
          resolve(res);
          return;
        }
        readAll(res, 64 << 10).then(
          (b) => reject(errorFromReply(status, res.headers["content-type"], b)),
          reject,
        );
      });
      req.on("error", (err) => reject(withHint(err)));
      if (c.timeoutMs) req.setTimeout(c.timeoutMs, () => req.destroy(new Error(`no reply within ${c.timeoutMs} ms`)));
      if (body instanceof Readable) {
        pipeline(body, req).catch((err) => req.destroy(err));
      } else {
        req.end(body);
      }
    });
  }

  /** fleetSend sends a lease's call to the lease's sidecar, looked up once (a handle
   * opened by id) and then kept by the handle. Other calls name no sidecar. */
  private async fleetSend(c: Call): Promise<IncomingMessage> {
    if (!c.lease) throw new Error("client: a request to a fleet must belong to a lease (or go to one of sidecars())");
    return (await this.bind(c.lease)).send(c);
  }

  /** bind is the client of h's daemon: this one, or on a fleet the lease's sidecar's,
   * which h keeps from then on. */
  async bind(h: LeaseHandle): Promise<Client> {
    if (this.fleet && h.client === this) {
      h.client = (await this.fleet.locate(h.id, h.credential() || undefined)).client;
    }
    return h.client;
  }

  async json<T>(c: Call): Promise<T> {
    const res = await this.send(c);
    const b = await readAll(res);
    return (b.length > 0 ? JSON.parse(b.toString("utf8")) : undefined) as T;
  }

  async empty(c: Call): Promise<void> {
    const res = await this.send(c);
    res.resume();
    await new Promise<void>((resolve, reject) => res.on("end", resolve).on("error", reject));
  }

  /** On a fleet, the info of one sidecar that answers. */
  info(): Promise<Info> {
    if (this.fleet) return this.fleet.any((m) => m.client.info());
    return this.json({ method: "GET", path: "/v1/info" });
  }

  /** On a fleet, the leases of every sidecar (oldest first); when some do not answer, a
   * FleetError naming them, with the others' leases as its partial. */
  async listLeases(): Promise<Lease[]> {
    if (this.fleet) {
      const f = this.fleet;
      const { results, errors } = await f.each(async (m) => {
        const leases = await m.client.listLeases();
        for (const l of leases) f.remember(l.id, m);
        return leases;
      });
      const all = results.flat().sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at));
      if (errors.length > 0) throw new FleetError<Lease[]>("client: some sidecars did not list their leases", errors, all);
      return all;
    }
    return (await this.json<Schemas["LeaseList"]>({ method: "GET", path: "/v1/leases" })).leases;
  }

  async getLease(id: string): Promise<Lease> {
    if (this.fleet) return (await this.fleet.locate(id)).client.getLease(id);
    return this.json({ method: "GET", path: leasePath(id) });
  }

  /** The lease's usage over the last hour: the daemon's samples, oldest first, one every
   * `interval_seconds` (10), at most 360. */
  async usageHistory(id: string): Promise<UsageHistory> {
    if (this.fleet) return (await this.fleet.locate(id)).client.usageHistory(id);
    return this.json({ method: "GET", path: leasePath(id) + "/usage" });
  }

  async releaseLease(id: string): Promise<void> {
    if (this.fleet) {
      const m = await this.fleet.locate(id);
      this.fleet.forget(id);
      return m.client.releaseLease(id);
    }
    return this.empty({ method: "DELETE", path: leasePath(id) });
  }

  /** On a fleet, every sidecar reaps and the results are merged; when some do not
   * answer, a FleetError naming them, with the others' merged result as its partial. */
  async cleanup(): Promise<CleanupResult> {
    if (this.fleet) {
      const { results, errors } = await this.fleet.each((m) => m.client.cleanup());
      const all = {
        leases: results.flatMap((r) => r.leases ?? []),
        cgroups: results.flatMap((r) => r.cgroups ?? []),
        workdirs: results.flatMap((r) => r.workdirs ?? []),
        processes: results.flatMap((r) => r.processes ?? []),
      };
      if (errors.length > 0) throw new FleetError<CleanupResult>("client: some sidecars did not clean up", errors, all);
      return all;
    }
    return this.json({ method: "POST", path: "/v1/cleanup" });
  }

  /** Drain (true: refuse new leases while the existing ones run to their end) or end a
   * drain (false); shared token only. A drain names one sidecar: a fleet refuses it. */
  drain(on = true): Promise<DrainStatus> {
    if (this.fleet) return Promise.reject(new Error("client: a drain names one sidecar; give its URL alone"));
    return this.json({ method: on ? "POST" : "DELETE", path: "/v1/drain" });
  }

  /** The operator's images (GET /v1/images): state, digest, size, leases on each; shared
   * token only. An acquire names one in `image`. Images belong to one sidecar: a fleet
   * refuses these calls. */
  listImages(): Promise<ImageList> {
    if (this.fleet) return Promise.reject(new Error("client: images belong to one sidecar; give its URL alone"));
    return this.json({ method: "GET", path: "/v1/images" });
  }

  /** Start a background pull of the image (again, if it is in the store) and resolve with
   * it as the pull starts; listImages shows the progress. */
  pullImage(name: string): Promise<ImageInfo> {
    if (this.fleet) return Promise.reject(new Error("client: images belong to one sidecar; give its URL alone"));
    return this.json({ method: "POST", path: `/v1/images/${encodeURIComponent(name)}/pull` });
  }

  /** Remove the image from the store (the name stays listed); an ImageInUseError while
   * leases run on it. */
  removeImage(name: string): Promise<void> {
    if (this.fleet) return Promise.reject(new Error("client: images belong to one sidecar; give its URL alone"));
    return this.empty({ method: "DELETE", path: `/v1/images/${encodeURIComponent(name)}` });
  }

  /** setNetwork replaces lease id's network policy (PUT /v1/leases/{id}/network) and
   * resolves with the lease. Shared token only: a lease token is a ForbiddenError, so code
   * inside a lease cannot open its own egress. New connections follow the new policy. */
  async setNetwork(id: string, policy: NetworkPolicy | "none"): Promise<Lease> {
    if (this.fleet) return (await this.fleet.locate(id)).client.setNetwork(id, policy);
    return this.json({ method: "PUT", path: leasePath(id, "network"), json: policy });
  }

  /** On a fleet, any sidecar that answers runs it: scripts touch no lease. */
  runScript(req: ScriptRequest): Promise<ScriptResult> {
    if (this.fleet) return this.fleet.any((m) => m.client.runScript(req));
    return this.json({ method: "POST", path: "/v1/scripts/run", json: req });
  }

  /** acquire takes the lease of req.session_id (the same active lease for the same
   * session) and renews it at a third of its TTL until release() or stopRenewing().
   * On a fleet, the session's existing lease is found on its sidecar, else the lease is
   * placed by capacity; a sidecar draining, full or silent is skipped for the next. */
  async acquire(req: AcquireRequest): Promise<LeaseHandle> {
    if (this.fleet) {
      const f = this.fleet;
      return f.place(req.session_id, async (m) => {
        const h = await m.client.acquire(req);
        f.remember(h.id, m);
        return h;
      });
    }
    const info = await this.json<Lease>({ method: "POST", path: "/v1/leases", json: req });
    const h = new LeaseHandle(this, info, false);
    h.startRenewing(req.ttl_seconds ? req.ttl_seconds * 1000 : Date.parse(info.expires_at) - Date.parse(info.created_at), req.ttl_seconds ?? 0);
    return h;
  }

  /** openLease is a handle on an existing lease by its lease token (a worker's case). It
   * does not renew; it keeps the fresh token the daemon sends after the owner renewed. */
  openLease(id: string, token: string): LeaseHandle {
    // On a fleet, the handle's first call finds the lease's sidecar (this client's map
    // of the leases it has seen, else one GET on every sidecar) and the handle keeps it.
    return new LeaseHandle(this, { id, token } as Lease, true);
  }
}

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`client: port ${port} outside 1..65535`);
}

export function leasePath(id: string, ...parts: string[]): string {
  return ["/v1/leases", encodeURIComponent(id), ...parts].join("/");
}

export async function readAll(r: Readable, limit = Infinity): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const chunk of r) {
    n += chunk.length;
    if (n > limit) {
      r.destroy();
      break;
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** LeaseHandle runs commands and moves files in one lease. */
export class LeaseHandle {
  /** The lease's daemon (on a fleet: its sidecar's client, once known). */
  client: Client;
  readonly id: string;
  info: Lease;
  /** Last background renewal failure, undefined while renewals succeed. */
  renewError?: Error;
  private readonly byToken: boolean;
  private timer?: NodeJS.Timeout;

  constructor(client: Client, info: Lease, byToken: boolean) {
    this.client = client;
    this.id = info.id;
    this.info = info;
    this.byToken = byToken;
  }

  get token(): string | undefined {
    return this.info.token;
  }

  /** credential is the token for this lease's routes; empty uses the client's. */
  credential(): string {
    return this.byToken ? this.info.token ?? "" : "";
  }

  tokenRefreshed(tok: string): void {
    if (this.byToken) this.info = { ...this.info, token: tok };
  }

  startRenewing(ttlMs: number, ttlSeconds: number): void {
    const every = Math.max(ttlMs / 3, 50);
    const tick = async () => {
      try {
        await this.renew(ttlSeconds);
        this.renewError = undefined;
      } catch (err) {
        this.renewError = err as Error;
        if (err instanceof LeaseNotFoundError || err instanceof LeaseExpiredError ||
            err instanceof UnauthorizedError || err instanceof ForbiddenError) {
          this.stopRenewing();
          return;
        }
      }
      if (this.timer) this.timer = setTimeout(tick, every).unref();
    };
    // unref: a pending renewal does not keep the process alive on its own.
    this.timer = setTimeout(tick, every).unref();
  }

  stopRenewing(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  async renew(ttlSeconds = 0): Promise<Lease> {
    const info = await this.client.json<Lease>({ method: "POST", path: leasePath(this.id, "renew"), json: { ttl_seconds: ttlSeconds }, lease: this });
    this.info = { ...info, token: info.token ?? this.info.token };
    return info;
  }

  async get(): Promise<Lease> {
    return this.client.json({ method: "GET", path: leasePath(this.id), lease: this });
  }

  /** Save what this lease wrote into its image's root, its workspace and its home as the
   * image `name` on its sidecar (POST /v1/leases/{id}/snapshot), resolved once ready;
   * acquires naming it in `image` start from it. ExistsError for a taken name. */
  async snapshot(name: string): Promise<ImageInfo> {
    return this.client.json({ method: "POST", path: leasePath(this.id, "snapshot"), json: { name }, lease: this });
  }

  /** setNetwork replaces this lease's network policy with the handle's credential (a
   * handle from acquire may; one opened with a lease token gets ForbiddenError). */
  async setNetwork(policy: NetworkPolicy | "none"): Promise<Lease> {
    const info = await this.client.json<Lease>({ method: "PUT", path: leasePath(this.id, "network"), json: policy, lease: this });
    this.info = { ...info, token: info.token ?? this.info.token };
    return info;
  }

  /** portURL is the daemon URL that reaches http://127.0.0.1:port/ inside the lease
   * (/v1/leases/{id}/ports/{port}/); append the path and query the server expects. Send
   * the credential of portHeaders with each request: the daemon does not forward it to
   * the server in the lease. Never hand this URL and the token to a browser: the shared
   * token opens every lease (docs/operations.md, Exposing a lease port). */
  async portURL(port: number): Promise<string> {
    checkPort(port);
    const c = await this.client.bind(this);
    const u = new URL(c.base.toString());
    u.pathname = c.base.pathname.replace(/\/$/, "") + leasePath(this.id, "ports", String(port)) + "/";
    return u.toString();
  }

  /** portHeaders are the headers a request to portURL needs (the handle's credential). */
  portHeaders(): Record<string, string> {
    return { authorization: `Bearer ${this.credential() || this.client.token}` };
  }

  /** portRequest sends one HTTP request to a server in the lease through the daemon and
   * resolves with its reply, whatever its status (the lease server's own); the daemon's
   * own refusals (port_unreachable, forbidden, …) reject as typed errors. */
  async portRequest(port: number, path: string, opts: { method?: string; headers?: OutgoingHttpHeaders; body?: Buffer | string } = {}): Promise<IncomingMessage> {
    const base = await this.portURL(port);
    const url = new URL(path.replace(/^\//, ""), base);
    const c = await this.client.bind(this);
    const body = typeof opts.body === "string" ? Buffer.from(opts.body) : opts.body;
    const headers: OutgoingHttpHeaders = { ...opts.headers, ...this.portHeaders() };
    if (body) headers["content-length"] = body.length;
    return new Promise((resolve, reject) => {
      const req = httpsRequest(url, { method: opts.method ?? "GET", headers, agent: c.agent }, (res) => {
        const mt = String(res.headers["content-type"] ?? "").split(";")[0].trim();
        // A problem body is the daemon's answer, not the lease server's.
        if ((res.statusCode ?? 0) >= 400 && mt === "application/problem+json") {
          readAll(res, 64 << 10).then((b) => reject(errorFromReply(res.statusCode ?? 0, mt, b)), reject);
          return;
        }
        resolve(res);
      });
      req.on("error", (err) => reject(withHint(err)));
      req.end(body);
    });
  }

  /** portForward opens a TCP connection to port inside the lease over the daemon's
   * port-forward websocket and resolves with a Duplex carrying its bytes (binary
   * messages). It ends when either side ends (no half-close); nothing listening is a
   * PortUnreachableError. */
  async portForward(port: number): Promise<Duplex> {
    checkPort(port);
    return dialPortForward(this, await this.client.bind(this), port);
  }

  async release(): Promise<void> {
    this.stopRenewing();
    await this.client.empty({ method: "DELETE", path: leasePath(this.id), lease: this });
  }

  exec(req: ExecRequest): Promise<ExecResult> {
    return this.client.json({ method: "POST", path: leasePath(this.id, "exec"), json: req, lease: this });
  }

  async processes(): Promise<ProcessInfo[]> {
    return (await this.client.json<Schemas["ProcessList"]>({ method: "GET", path: leasePath(this.id, "processes"), lease: this })).processes;
  }

  process(pid: string): Promise<ProcessInfo> {
    return this.client.json({ method: "GET", path: leasePath(this.id, "processes", encodeURIComponent(pid)), lease: this });
  }

  signal(pid: string, signal: string): Promise<void> {
    return this.client.empty({ method: "POST", path: leasePath(this.id, "processes", encodeURIComponent(pid), "signal"), json: { signal }, lease: this });
  }

  /** newShell starts a persistent shell session (bash when the lease has it, else sh). */
  newShell(req: ShellCreateRequest = {}): Promise<ShellInfo> {
    return this.client.json({ method: "POST", path: leasePath(this.id, "shells"), json: req, lease: this });
  }

  async shells(): Promise<ShellInfo[]> {
    return (await this.client.json<Schemas["ShellList"]>({ method: "GET", path: leasePath(this.id, "shells"), lease: this })).shells;
  }

  shell(sid: string): Promise<ShellInfo> {
    return this.client.json({ method: "GET", path: leasePath(this.id, "shells", encodeURIComponent(sid)), lease: this });
  }

  /** runShell runs one command in a session; ShellBusyError while another runs.
   * outputHeadBytes: as an exec's output_head_bytes (undefined: the daemon's half). */
  runShell(sid: string, command: string, timeoutSeconds = 0, outputHeadBytes?: number): Promise<ShellResult> {
    const json: Schemas["ShellRunRequest"] = { command, timeout_seconds: timeoutSeconds };
    if (outputHeadBytes !== undefined) json.output_head_bytes = outputHeadBytes;
    return this.client.json({ method: "POST", path: leasePath(this.id, "shells", encodeURIComponent(sid), "run"), json, lease: this });
  }

  closeShell(sid: string): Promise<void> {
    return this.client.empty({ method: "DELETE", path: leasePath(this.id, "shells", encodeURIComponent(sid)), lease: this });
  }

  /** signalLeftover signals one process a finished command left running in the lease (a
   * pid from the lease's `leftovers`); any other pid is a `process_not_found` error. */
  signalLeftover(pid: number, signal: string): Promise<void> {
    return this.client.empty({ method: "POST", path: leasePath(this.id, "leftovers", String(pid), "signal"), json: { signal }, lease: this });
  }

  /** start starts a background process and attaches to it from offset 0; a dropped
   * connection reattaches at the exact output offset. With `lossless`, the daemon holds the
   * output from its first byte for this handle, and the process waits for its reader. */
  async start(req: StartRequest): Promise<Process> {
    const info = await this.client.json<ProcessInfo>({ method: "POST", path: leasePath(this.id, "processes"), json: req, lease: this });
    return this.attach(info.pid, 0, req.tty ?? false, { lossless: req.lossless ?? false });
  }

  /** attach attaches to a background process from output offset since (-1: live only).
   * With `lossless`, the process waits for this reader rather than drop output it has not
   * read (a daemon without lossless viewers is refused with UnsupportedError). */
  async attach(pid: string, since = 0, tty = false, opts: { lossless?: boolean } = {}): Promise<Process> {
    const p = new Process(this, pid, tty, true, undefined, opts.lossless ?? false);
    await p.connect(since);
    return p;
  }

  /** execStream starts a command and attaches in one round trip (the websocket exec). */
  async execStream(opts: ExecStreamOptions): Promise<Process> {
    const p = new Process(this, "", opts.tty ?? false, opts.detach ?? false, opts);
    await p.connect(0);
    return p;
  }

  private filePath(p: string, kind = "files"): string {
    return leasePath(this.id, kind, escapePath(p));
  }

  /** writeFile writes a whole file atomically (bytes or a stream). */
  async writeFile(p: string, data: Buffer | string | Readable, opts: { mode?: number; mkdirs?: boolean; digest?: string } = {}): Promise<void> {
    const headers: OutgoingHttpHeaders = { "content-type": "application/octet-stream" };
    if (opts.mode !== undefined) headers["x-file-mode"] = opts.mode.toString(8).padStart(4, "0");
    if (opts.digest) headers["content-digest"] = `sha-256=:${opts.digest}:`;
    const body = typeof data === "string" ? Buffer.from(data) : data;
    await this.client.empty({ method: "PUT", path: this.filePath(p), query: opts.mkdirs ? { mkdirs: "1" } : undefined, headers, body, lease: this });
  }

  /** upload is writeFile for a stream: the bytes are never held in memory whole. */
  upload(p: string, body: Readable, opts: { mode?: number; mkdirs?: boolean; digest?: string } = {}): Promise<void> {
    return this.writeFile(p, body, opts);
  }

  async readFile(p: string): Promise<Buffer> {
    return readAll(await this.download(p));
  }

  /** download streams a file; with digest, the reply carries Repr-Digest (see digestOf). */
  async download(p: string, opts: { digest?: boolean } = {}): Promise<IncomingMessage> {
    return this.client.send({ method: "GET", path: this.filePath(p), query: opts.digest ? { digest: "sha-256" } : undefined, lease: this });
  }

  async list(p = "."): Promise<FileEntry[]> {
    const res = await this.client.send({ method: "GET", path: this.filePath(p), lease: this });
    const b = await readAll(res);
    if (!String(res.headers["content-type"]).startsWith("application/json")) {
      throw new Error(`list ${p}: not a directory`);
    }
    return (JSON.parse(b.toString("utf8")) as DirListing).entries;
  }

  /** stat reads a path's metadata (HEAD). */
  async stat(p: string): Promise<FileEntry> {
    const res = await this.client.send({ method: "HEAD", path: this.filePath(p), lease: this });
    res.resume();
    const h = res.headers;
    return {
      name: p.split("/").filter(Boolean).pop() ?? ".",
      type: (h["x-file-type"] as FileEntry["type"]) ?? "other",
      size: Number(h["x-file-size"] ?? 0),
      mode: String(h["x-file-mode"] ?? ""),
      mtime: String(h["x-file-mtime"] ?? ""),
      target: h["x-symlink-target"] as string | undefined,
    };
  }

  remove(p: string, recursive = false): Promise<void> {
    return this.client.empty({ method: "DELETE", path: this.filePath(p), query: recursive ? { recursive: "1" } : undefined, lease: this });
  }

  mkdir(p: string): Promise<void> {
    return this.client.empty({ method: "POST", path: this.filePath(p), query: { op: "mkdir" }, lease: this });
  }

  move(from: string, to: string): Promise<void> {
    return this.client.empty({ method: "POST", path: this.filePath(from), query: { op: "move", to: escapePath(to) }, lease: this });
  }

  /** putTree extracts a tar stream into dir, all or nothing. */
  putTree(dir: string, tar: Readable, encoding?: "gzip" | "zstd"): Promise<ArchiveStats> {
    const headers: OutgoingHttpHeaders = { "content-type": "application/x-tar" };
    if (encoding) headers["content-encoding"] = encoding;
    return this.client.json({ method: "PUT", path: this.filePath(dir, "archive"), headers, body: tar, lease: this });
  }

  /** getTree streams dir as an uncompressed tar. */
  getTree(dir: string): Promise<IncomingMessage> {
    return this.client.send({ method: "GET", path: this.filePath(dir, "archive"), lease: this });
  }
}
