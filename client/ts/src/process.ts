// A process over the websocket framing of docs/api.md (v5.channel.k8s.io): output on
// channels 1 and 2, the status once on 3, stdin on 0, resize on 4, close-channel on 255.
// A handle on a background process survives dropped connections: it reattaches with
// since = the output offset it has delivered, so the output arrives byte-exact.
import { PassThrough } from "node:stream";
import WebSocket, { type ClientOptions } from "ws";
import type { components } from "./openapi.js";
import { errorFromReply, withHint, SidecarError } from "./errors.js";
import { leasePath, readAll, type LeaseHandle } from "./client.js";

export type StreamStatus = {
  status: "Success" | "Failure";
  reason?: string;
  message?: string;
  exit_code: number;
  signal?: string;
  timed_out: boolean;
  oom_killed: boolean;
  lost?: boolean;
  bytes_lost?: number;
};

export interface ExecStreamOptions {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  tty?: boolean;
  stdin?: boolean;
  rows?: number;
  cols?: number;
  /** keep the process running when the connection closes; the handle then reattaches */
  detach?: boolean;
  timeoutSeconds?: number;
  idleTimeoutSeconds?: number;
  /** the process waits for this reader rather than lose output (docs/api.md, Lossless viewers) */
  lossless?: boolean;
}

/** UnsupportedError: the daemon does not offer what was asked (a lossless viewer). */
export class UnsupportedError extends Error {}

const CH_STDIN = 0, CH_STDOUT = 1, CH_STDERR = 2, CH_STATUS = 3, CH_RESIZE = 4, CH_CLOSE = 255;
const PROTOCOL = "v5.channel.k8s.io";

/** ConnectionLostError: the stream broke and could not be resumed. */
export class ConnectionLostError extends Error {}

export class Process {
  readonly lease: LeaseHandle;
  /** the daemon's process id ("" until an exec stream's upgrade names it) */
  id: string;
  readonly tty: boolean;
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  /** output bytes (stdout and stderr together) delivered so far */
  offset = 0;
  /** output bytes that had left the daemon's buffer before a resume reached them */
  lost = 0;
  /** connections opened so far (1 + reattaches) */
  connections = 0;
  /** whether the daemon holds the process for this handle rather than drop output it has
   * not read: the socket is then paused while stdout or stderr is full (backpressure) */
  readonly lossless: boolean;

  private readonly reattach: boolean;
  private readonly exec?: ExecStreamOptions;
  private ws?: WebSocket;
  private done = false;
  private closed = false;
  private readonly waiters: Array<{ resolve: (s: StreamStatus) => void; reject: (e: Error) => void }> = [];
  private result?: { status?: StreamStatus; error?: Error };
  private failures = 0;

  constructor(lease: LeaseHandle, id: string, tty: boolean, reattach: boolean, exec?: ExecStreamOptions, lossless = false) {
    this.lease = lease;
    this.id = id;
    this.tty = tty;
    this.reattach = reattach;
    this.exec = exec;
    this.lossless = lossless || (exec?.lossless ?? false);
  }

  /** wait resolves with the final status once the process has ended. */
  wait(): Promise<StreamStatus> {
    if (this.result) {
      return this.result.error ? Promise.reject(this.result.error) : Promise.resolve(this.result.status!);
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** write sends bytes to the process's stdin. */
  write(data: Buffer | string): void {
    this.send(CH_STDIN, typeof data === "string" ? Buffer.from(data) : data);
  }

  /** closeStdin ends stdin (EOF for the process). */
  closeStdin(): void {
    this.send(CH_CLOSE, Buffer.from([CH_STDIN]));
  }

  /** resize sets a PTY's size. */
  resize(rows: number, cols: number): void {
    this.send(CH_RESIZE, Buffer.from(JSON.stringify({ Width: cols, Height: rows })));
  }

  /** signal signals the process group (a background process or a named exec stream). */
  signal(name: string): Promise<void> {
    return this.lease.signal(this.id, name);
  }

  /** close drops the connection and stops reattaching; the process runs on when detached. */
  close(): void {
    this.closed = true;
    this.ws?.close();
    this.finish(undefined, new ConnectionLostError("closed by the client"));
  }

  /** dropConnection cuts the current connection as a network failure would: the handle
   * reattaches where it stopped. Tests use it to prove resumption. */
  dropConnection(): void {
    this.ws?.terminate();
  }

  private send(channel: number, payload: Buffer): void {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) throw new ConnectionLostError("not connected");
    this.ws.send(Buffer.concat([Buffer.from([channel]), payload]));
  }

  /** connect opens one websocket from output offset since and resolves once upgraded. */
  async connect(since: number): Promise<void> {
    const c = await this.lease.client.bind(this.lease); // a fleet's lease: its sidecar
    const url = new URL(c.base.toString());
    url.protocol = "wss:";
    const q = url.searchParams;
    if (this.id === "" && this.exec) {
      const e = this.exec;
      url.pathname = leasePath(this.lease.id, "exec");
      for (const a of e.argv) q.append("command", a);
      for (const [k, v] of Object.entries(e.env ?? {})) q.append("env", `${k}=${v}`);
      if (e.cwd) q.set("cwd", e.cwd);
      if (e.tty) q.set("tty", "1");
      if (e.stdin) q.set("stdin", "1");
      if (e.detach) q.set("detach", "1");
      if (e.rows && e.cols) {
        q.set("rows", String(e.rows));
        q.set("cols", String(e.cols));
      }
      if (e.timeoutSeconds) q.set("timeout_seconds", String(e.timeoutSeconds));
      if (e.idleTimeoutSeconds) q.set("idle_timeout_seconds", String(e.idleTimeoutSeconds));
    } else {
      url.pathname = leasePath(this.lease.id, "processes", encodeURIComponent(this.id), "attach");
      q.set("since", String(since));
    }
    if (this.lossless) q.set("lossless", "1");
    const token = this.lease.credential() || c.token;
    return new Promise((resolve, reject) => {
      // servername: a DNS fleet's member is dialled by address, verified by the name (ws
      // hands its options to tls.connect).
      const opts: ClientOptions & { servername?: string } = {
        headers: { authorization: `Bearer ${token}` },
        ca: c.ca,
        servername: c.servername,
        maxPayload: 16 << 20,
        perMessageDeflate: false,
      };
      const ws = new WebSocket(url, [PROTOCOL], opts);
      ws.binaryType = "nodebuffer";
      let upgraded = false;
      let start = since;
      ws.on("upgrade", (res) => {
        upgraded = true;
        this.connections++;
        const off = res.headers["x-output-offset"];
        if (typeof off === "string") start = Number(off);
        const pid = res.headers["x-process-id"];
        if (typeof pid === "string" && this.id === "") this.id = pid;
        if (this.lossless && res.headers["x-output-mode"] !== "lossless") {
          // An older daemon ignores ?lossless: it would drop bytes this caller must not lose.
          upgraded = false;
          ws.terminate();
          reject(new UnsupportedError("the daemon does not hold processes for lossless viewers (no X-Output-Mode: lossless)"));
        }
      });
      ws.on("unexpected-response", (_req, res) => {
        readAll(res, 64 << 10).then(
          (b) => reject(errorFromReply(res.statusCode ?? 0, res.headers["content-type"], b)),
          reject,
        );
      });
      ws.on("open", () => {
        this.ws = ws;
        // The daemon replays from start; bytes before our offset were delivered already.
        let skip = Math.max(since - start, 0);
        if (start > since && since >= 0) {
          this.lost += start - since;
        }
        if (since < 0 || start > since) this.offset = start;
        resolve();
        ws.on("message", (data: Buffer, isBinary: boolean) => {
          if (!isBinary || data.length === 0) return;
          this.failures = 0;
          const ch = data[0];
          let payload = data.subarray(1);
          if (ch === CH_STDOUT || ch === CH_STDERR) {
            if (skip > 0) {
              const n = Math.min(skip, payload.length);
              payload = payload.subarray(n);
              skip -= n;
            }
            if (payload.length === 0) return;
            this.offset += payload.length;
            const out = ch === CH_STDERR && !this.tty ? this.stderr : this.stdout;
            if (!out.write(payload) && this.lossless) {
              // Stop reading the socket until the reader drained: TCP then backs up to
              // the daemon, which holds the process.
              ws.pause();
              out.once("drain", () => ws.resume());
            }
          } else if (ch === CH_STATUS) {
            const st = JSON.parse(payload.toString("utf8")) as StreamStatus;
            this.finish(st);
          }
        });
      });
      ws.on("error", (err) => {
        if (!upgraded) reject(withHint(err));
      });
      ws.on("close", () => {
        if (!upgraded || this.done || this.closed) return;
        void this.resume(new ConnectionLostError("the stream broke before the process ended"));
      });
    });
  }

  /** resume reattaches at the delivered offset, with backoff, a bounded number of times
   * in a row without progress. */
  private async resume(cause: Error): Promise<void> {
    if (!this.reattach || this.id === "") {
      this.finish(undefined, cause);
      return;
    }
    for (;;) {
      if (this.done || this.closed) return;
      this.failures++;
      if (this.failures > 8) {
        this.finish(undefined, cause);
        return;
      }
      await new Promise((r) => setTimeout(r, Math.min(25 * 2 ** this.failures, 1000)));
      try {
        await this.connect(this.offset);
        return;
      } catch (err) {
        if (err instanceof SidecarError) {
          this.finish(undefined, err);
          return;
        }
        cause = err as Error;
      }
    }
  }

  private finish(status?: StreamStatus, error?: Error): void {
    if (this.done) return;
    this.done = true;
    this.stdout.end();
    this.stderr.end();
    if (status && status.bytes_lost) this.lost = Math.max(this.lost, status.bytes_lost);
    this.result = { status, error };
    for (const w of this.waiters.splice(0)) {
      if (error) w.reject(error);
      else w.resolve(status!);
    }
    this.ws?.close();
  }
}

export type { components };
