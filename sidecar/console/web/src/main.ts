// The operator console: hash-routed pages over the v1 API, polled live.
import "./nonce";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import * as api from "./api";
import { h, bytes, duration, since, until, meter, confirmDialog } from "./dom";
import { openStream, sendStdin, sendResize } from "./ws";
import { lineChart } from "./chart";

// POLL_MS is how often a page re-reads what it shows.
const POLL_MS = 2000;

const app = () => document.getElementById("app")!;
let stopPage: (() => void)[] = [];
let afterSignIn = "#/";

function cleanup(): void {
  for (const f of stopPage) f();
  stopPage = [];
}

// every runs f now and then every ms until the page changes.
function every(ms: number, f: () => Promise<void>): void {
  let stopped = false;
  let timer = 0;
  const tick = async () => {
    try {
      await f();
    } catch (e) {
      if (!(e instanceof api.APIError && e.status === 401)) showError(e);
    }
    if (!stopped) timer = window.setTimeout(tick, ms);
  };
  stopPage.push(() => {
    stopped = true;
    clearTimeout(timer);
  });
  void tick();
}

function showError(e: unknown): void {
  const bar = document.getElementById("error");
  if (bar) bar.textContent = e instanceof Error ? e.message : String(e);
}

function frame(title: string, ...body: Node[]): void {
  cleanup();
  app().replaceChildren(
    h("header", {},
      h("a", { href: "#/", class: "brand" }, "sidecar"),
      h("nav", {}, h("a", { href: "#/" }, "Daemon & leases")),
      h("button", { type: "button", class: "link", id: "signout", onclick: async () => { await api.signOut(); location.hash = "#/signin"; } }, "Sign out")),
    h("div", { id: "error", role: "alert" }),
    h("main", {}, h("h1", {}, title), ...body),
  );
}

// --- sign-in -------------------------------------------------------------------------

function signInPage(): void {
  cleanup();
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true, placeholder: "shared token" });
  const msg = h("p", { class: "error", id: "signin-error" });
  const form = h("form", { id: "signin" },
    h("label", { for: "token" }, "Shared token (SIDECAR_AUTH_TOKEN)"), input,
    h("button", { type: "submit" }, "Sign in"), msg);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value;
    input.value = ""; // the token stays nowhere in the page
    try {
      await api.signIn(token);
      location.hash = afterSignIn === "#/signin" ? "#/" : afterSignIn;
    } catch (err) {
      msg.textContent = `Sign-in refused: ${(err as Error).message}`;
    }
  });
  app().replaceChildren(h("main", { class: "signin" }, h("h1", {}, "sidecar console"), form));
  input.focus();
}

// --- daemon and leases -----------------------------------------------------------------

type SortKey = "session" | "age" | "ttl" | "memory" | "cpu" | "pids" | "disk";
let sortKey: SortKey = "age";
let sortDesc = false;
let filterText = "";

function overviewPage(): void {
  const daemon = h("section", { id: "daemon" }, "Loading…");
  const filter = h("input", { type: "search", id: "filter", placeholder: "filter by session, id or label", value: filterText });
  const table = h("table", { id: "leases" });
  filter.addEventListener("input", () => {
    filterText = filter.value;
    void refreshLeases();
  });
  frame("Daemon", daemon, h("h2", {}, "Leases"), filter, table);
  let leases: api.Lease[] = [];
  const refreshLeases = async () => renderLeases(table, leases);
  every(POLL_MS, async () => {
    const [info, list] = await Promise.all([api.getJSON<api.Info>("/v1/info"), api.getJSON<{ leases: api.Lease[] }>("/v1/leases")]);
    daemon.replaceChildren(renderInfo(info));
    leases = list.leases;
    await refreshLeases();
  });
}

function renderInfo(i: api.Info): HTMLElement {
  const c = i.capabilities, cap = i.capacity;
  const row = (k: string, v: Node | string) => h("tr", {}, h("th", {}, k), h("td", {}, v));
  return h("table", { class: "kv" },
    row("version", i.version),
    row("isolation", `${c.isolation} (cgroups ${c.cgroups}, Landlock ABI ${c.landlock_abi}, seccomp ${c.seccomp ? "on" : "off"}, disk quota ${c.disk_quota})`),
    row("layers", c.layers.join(", ") || "none"),
    row("leases", `${cap.active_leases} active, ${cap.free_leases} free of ${i.limits.max_leases}`),
    row("memory", meter(cap.memory_committed_bytes, cap.memory_bytes, bytes)),
    row("certificate", i.cert_not_after ? h("span", { id: "cert", class: until(i.cert_not_after) < 14 * 86400 ? "warn" : "" },
      `expires ${new Date(i.cert_not_after).toISOString().slice(0, 10)}, in ${duration(until(i.cert_not_after))}`) : "—"),
    row("draining", h("span", { id: "draining", class: i.draining ? "warn" : "" }, i.draining ? "yes: new leases are refused" : "no")),
  );
}

function sortValue(l: api.Lease, k: SortKey): number | string {
  const u = l.usage;
  switch (k) {
    case "session": return l.session_id;
    case "age": return Date.parse(l.created_at);
    case "ttl": return Date.parse(l.expires_at);
    case "memory": return u?.memory_bytes ?? 0;
    case "cpu": return u?.cpu_seconds ?? 0;
    case "pids": return u?.pids ?? 0;
    case "disk": return u?.disk_bytes ?? 0;
  }
}

function renderLeases(table: HTMLTableElement, leases: api.Lease[]): void {
  const f = filterText.toLowerCase();
  const shown = leases.filter((l) => !f || [l.id, l.session_id, ...Object.entries(l.labels ?? {}).map(([k, v]) => `${k}=${v}`)].some((s) => s.toLowerCase().includes(f)));
  shown.sort((a, b) => {
    const x = sortValue(a, sortKey), y = sortValue(b, sortKey);
    const r = x < y ? -1 : x > y ? 1 : 0;
    return sortDesc ? -r : r;
  });
  const th = (k: SortKey | "", label: string) => h("th", k ? {
    class: "sortable" + (k === sortKey ? (sortDesc ? " desc" : " asc") : ""),
    onclick: () => {
      if (sortKey === k) sortDesc = !sortDesc;
      else [sortKey, sortDesc] = [k, false];
      renderLeases(table, leases);
    },
  } : {}, label);
  table.replaceChildren(
    h("thead", {}, h("tr", {}, th("session", "session"), th("", "labels"), th("age", "age"), th("ttl", "expires in"),
      th("memory", "memory"), th("cpu", "CPU"), th("pids", "pids"), th("disk", "disk"), th("", "processes"), th("", "leftovers"))),
    h("tbody", {}, ...shown.map((l) => h("tr", { "data-lease": l.id },
      h("td", {}, h("a", { href: `#/lease/${encodeURIComponent(l.id)}`, class: "lease-link" }, l.session_id), h("div", { class: "id" }, l.id)),
      h("td", {}, Object.entries(l.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(" ")),
      h("td", {}, duration(since(l.created_at))),
      h("td", {}, duration(until(l.expires_at))),
      h("td", {}, meter(l.usage?.memory_bytes, l.limits.memory_bytes, bytes)),
      h("td", {}, l.usage ? `${l.usage.cpu_seconds.toFixed(1)} s` : "—", l.limits.cpu_millicores ? ` (${l.limits.cpu_millicores / 1000} CPU)` : ""),
      h("td", {}, meter(l.usage?.pids, l.limits.pids, String)),
      h("td", {}, meter(l.usage?.disk_bytes, l.limits.disk_bytes, bytes)),
      h("td", {}, l.process_count),
      h("td", {}, l.leftover_count)))),
  );
  if (shown.length === 0) table.append(h("tbody", {}, h("tr", {}, h("td", { colspan: "10" }, leases.length ? "No lease matches the filter." : "No lease."))));
}

// --- one lease -------------------------------------------------------------------------

function leasePage(id: string): void {
  const summary = h("section", { id: "summary" }, "Loading…");
  const charts = h("section", { id: "charts", class: "charts" });
  const procs = h("section", { id: "processes" });
  const output = h("pre", { id: "output", class: "output" });
  const files = h("section", { id: "files" });
  const term = h("section", { id: "terminal" });
  const actions = h("div", { class: "actions" },
    h("button", { type: "button", id: "renew", onclick: () => renew(id) }, "Renew"),
    h("button", { type: "button", id: "release", class: "danger", onclick: () => release(id) }, "Release"),
    h("button", { type: "button", id: "open-terminal", onclick: () => openTerminal(id, term) }, "Open terminal"));
  frame(`Lease ${id}`, actions, summary, h("h2", {}, "Usage over the last hour"), charts,
    h("h2", {}, "Processes and leftovers"), procs, output,
    h("h2", {}, "Files"), files, h("h2", {}, "Terminal"), term);
  const fb = new FileBrowser(id, files);
  void fb.show("");
  let lastChart = 0;
  every(POLL_MS, async () => {
    const [l, pl] = await Promise.all([api.getJSON<api.Lease>(api.leasePath(id)), api.getJSON<{ processes: api.Process[] }>(api.leasePath(id, "/processes"))]);
    summary.replaceChildren(renderLeaseSummary(l));
    procs.replaceChildren(renderProcesses(id, l, pl.processes, output));
    // The daemon takes a sample every 10 s: the charts are redrawn as often.
    if (Date.now() - lastChart >= 10_000) {
      lastChart = Date.now();
      const hist = await api.getJSON<{ interval_seconds: number; samples: api.UsageSample[] }>(api.leasePath(id, "/usage"));
      charts.replaceChildren(...renderCharts(hist.samples, l.limits),
        h("p", { class: "note" }, `${hist.samples.length} samples, one every ${hist.interval_seconds} s, the last hour at most (kept by the daemon).`));
    }
  });
}

function renderCharts(samples: api.UsageSample[], limits: api.Limits): HTMLElement[] {
  const pts = (f: (s: api.UsageSample) => number) => samples.map((s) => ({ t: Date.parse(s.at), v: f(s) }));
  // CPU as cores used between samples.
  const cpu: { t: number; v: number }[] = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (Date.parse(samples[i].at) - Date.parse(samples[i - 1].at)) / 1000;
    if (dt > 0) cpu.push({ t: Date.parse(samples[i].at), v: Math.max(0, samples[i].cpu_seconds - samples[i - 1].cpu_seconds) / dt });
  }
  return [
    lineChart("memory", pts((s) => s.memory_bytes), limits.memory_bytes, bytes),
    lineChart("CPU (cores)", cpu, limits.cpu_millicores ? limits.cpu_millicores / 1000 : undefined, (n) => n.toFixed(2)),
    lineChart("pids", pts((s) => s.pids), limits.pids, String),
    lineChart("disk", pts((s) => s.disk_bytes), limits.disk_bytes, bytes),
  ];
}

function renderLeaseSummary(l: api.Lease): HTMLElement {
  const u = l.usage;
  const row = (k: string, v: Node | string) => h("tr", {}, h("th", {}, k), h("td", {}, v));
  return h("table", { class: "kv" },
    row("session", l.session_id),
    row("labels", Object.entries(l.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(" ") || "—"),
    row("state", l.state),
    row("image", l.image || "host"),
    row("network", networkPolicy(l.network)),
    row("traffic", networkTraffic(l.network_stats)),
    row("age", duration(since(l.created_at))),
    row("expires in", h("span", { id: "expires" }, duration(until(l.expires_at)))),
    row("memory", meter(u?.memory_bytes, l.limits.memory_bytes, bytes)),
    row("CPU", u ? `${u.cpu_seconds.toFixed(1)} s${l.limits.cpu_millicores ? ` (limit ${l.limits.cpu_millicores / 1000} CPU)` : ""}` : "—"),
    row("pids", meter(u?.pids, l.limits.pids, String)),
    row("disk", meter(u?.disk_bytes, l.limits.disk_bytes, bytes)),
    row("OOM kills", String(u?.oom_kills ?? 0)),
  );
}

function networkPolicy(p: api.NetworkPolicy): string {
  const parts = [p.egress];
  if (p.allow_out?.length) parts.push(`allow ${p.allow_out.join(" ")}`);
  if (p.deny_out?.length) parts.push(`deny ${p.deny_out.join(" ")}`);
  return parts.join("; ");
}

// Absent stats: the lease shares the host's network, where the daemon sees no traffic.
function networkTraffic(s?: api.NetworkStats): string {
  if (!s) return "— (host network)";
  return `${bytes(s.bytes_sent)} sent, ${bytes(s.bytes_received)} received; connections ${s.connections_allowed} allowed, ${s.connections_denied} denied, ${s.connections_open} open`;
}

let following: WebSocket | null = null;

function renderProcesses(id: string, l: api.Lease, ps: api.Process[], output: HTMLElement): HTMLElement {
  const kill = (what: string, path: string) => async () => {
    if (!(await confirmDialog(`Send KILL to ${what}?`, "Kill"))) return;
    try {
      await api.call("POST", path, { signal: "KILL" });
    } catch (e) {
      showError(e);
    }
  };
  const follow = (p: api.Process) => () => {
    following?.close();
    output.textContent = "";
    const dec = new TextDecoder();
    following = openStream(api.leasePath(id, `/processes/${encodeURIComponent(p.pid)}/attach?since=0`), {
      output: (b) => {
        output.textContent += dec.decode(b, { stream: true });
        output.scrollTop = output.scrollHeight;
      },
      status: (s) => (output.textContent += `\n[ended: ${s.signal ? "signal " + s.signal : "exit " + (s.exit_code ?? 0)}]\n`),
      closed: () => {},
    });
    stopPage.push(() => following?.close());
  };
  return h("table", { class: "procs" },
    h("thead", {}, h("tr", {}, h("th", {}, "kind"), h("th", {}, "pid"), h("th", {}, "command"), h("th", {}, "state"), h("th", {}, "started"), h("th", {}))),
    h("tbody", {},
      ...ps.map((p) => h("tr", { "data-pid": p.pid },
        h("td", {}, p.tty ? "tty" : "background"), h("td", {}, p.pid), h("td", { class: "argv" }, p.argv.join(" ")),
        h("td", {}, p.state + (p.exit_code !== undefined ? ` (${p.exit_code})` : "")), h("td", {}, duration(since(p.started_at)) + " ago"),
        h("td", {},
          h("button", { type: "button", class: "follow", onclick: follow(p) }, "Output"),
          p.state === "running" ? h("button", { type: "button", class: "danger", onclick: kill(`process ${p.pid}`, api.leasePath(id, `/processes/${encodeURIComponent(p.pid)}/signal`)) }, "Kill") : null))),
      ...(l.leftovers ?? []).map((x) => h("tr", { "data-leftover": String(x.pid) },
        h("td", {}, "leftover"), h("td", {}, String(x.pid)), h("td", { class: "argv" }, x.argv.join(" ")), h("td", {}, bytes(x.rss_bytes) + " RSS"),
        h("td", {}, duration(since(x.started_at)) + " ago"),
        h("td", {}, h("button", { type: "button", class: "danger", onclick: kill(`leftover ${x.pid}`, api.leasePath(id, `/leftovers/${x.pid}/signal`)) }, "Kill")))),
    ),
  );
}

async function renew(id: string): Promise<void> {
  const l = await api.getJSON<api.Lease>(api.leasePath(id));
  const ttl = Math.max(60, Math.round(until(l.expires_at)) + 900);
  if (!(await confirmDialog(`Renew lease ${id} to expire in ${duration(ttl)}?`, "Renew"))) return;
  try {
    await api.call("POST", api.leasePath(id, "/renew"), { ttl_seconds: ttl }); // its lease token is dropped
  } catch (e) {
    showError(e);
  }
}

async function release(id: string): Promise<void> {
  if (!(await confirmDialog(`Release lease ${id}? Its processes are killed and its files removed.`, "Release"))) return;
  try {
    await api.call("DELETE", api.leasePath(id));
    location.hash = "#/";
  } catch (e) {
    showError(e);
  }
}

// --- files -----------------------------------------------------------------------------

class FileBrowser {
  private dir = "";
  constructor(private id: string, private root: HTMLElement) {}

  async show(dir: string): Promise<void> {
    this.dir = dir;
    let list: { entries: api.FileEntry[] };
    try {
      list = await api.getJSON(api.filePath(this.id, "files", dir));
    } catch (e) {
      showError(e);
      return;
    }
    const up = dir ? dir.split("/").slice(0, -1).join("/") : null;
    const upload = h("input", { type: "file", id: "upload", multiple: true });
    upload.addEventListener("change", () => void this.upload(upload.files));
    const entries = [...list.entries].sort((a, b) => (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || a.name.localeCompare(b.name));
    this.root.replaceChildren(
      h("div", { class: "path" }, `/workspace/${dir}`, " ", h("label", { class: "button" }, "Upload ", upload)),
      h("table", { class: "files" }, h("tbody", {},
        up !== null ? h("tr", {}, h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); void this.show(up); } }, "..")), h("td", {}), h("td", {})) : null,
        ...entries.map((f) => {
          const path = dir ? `${dir}/${f.name}` : f.name;
          const name = f.type === "dir"
            ? h("a", { href: "#", class: "dir", onclick: (e) => { e.preventDefault(); void this.show(path); } }, f.name + "/")
            : h("a", { href: "#", class: "file", "data-name": f.name, onclick: (e) => { e.preventDefault(); void this.download(path, f.name); } }, f.name);
          return h("tr", { "data-file": f.name }, h("td", {}, name), h("td", {}, f.type === "dir" ? "" : bytes(f.size)), h("td", {}, f.mode));
        }))),
    );
  }

  // download fetches the file with the session and hands it to the browser as a
  // download: a lease's file never opens as a page of the daemon.
  async download(path: string, name: string): Promise<void> {
    try {
      const blob = await (await api.call("GET", api.filePath(this.id, "files", path))).blob();
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    } catch (e) {
      showError(e);
    }
  }

  async upload(files: FileList | null): Promise<void> {
    for (const f of Array.from(files ?? [])) {
      const path = this.dir ? `${this.dir}/${f.name}` : f.name;
      try {
        await api.call("PUT", api.filePath(this.id, "files", path), f);
      } catch (e) {
        showError(e);
      }
    }
    await this.show(this.dir);
  }
}

// --- terminal --------------------------------------------------------------------------

// The shell the terminal runs: bash when the lease has it, else sh.
const SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"];

function openTerminal(id: string, root: HTMLElement): void {
  const box = h("div", { class: "xterm-box", id: "xterm" });
  const status = h("div", { class: "term-status" }, "connecting…");
  root.replaceChildren(box, status);
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const q = new URLSearchParams();
  for (const a of SHELL) q.append("command", a);
  q.set("tty", "1");
  q.set("stdin", "1");
  q.set("rows", String(term.rows));
  q.set("cols", String(term.cols));
  const ws = openStream(api.leasePath(id, `/exec?${q}`), {
    output: (b) => term.write(b),
    status: (s) => (status.textContent = `ended: ${s.signal ? "signal " + s.signal : "exit " + (s.exit_code ?? 0)}`),
    closed: (reason) => { if (!status.textContent?.startsWith("ended")) status.textContent = `disconnected: ${reason}`; },
  });
  ws.onopen = () => {
    status.textContent = "connected";
    sendResize(ws, term.cols, term.rows);
  };
  term.onData((d) => sendStdin(ws, d));
  term.onResize(({ cols, rows }) => sendResize(ws, cols, rows));
  const onWin = () => fit.fit();
  window.addEventListener("resize", onWin);
  term.focus();
  stopPage.push(() => {
    window.removeEventListener("resize", onWin);
    ws.close();
    term.dispose();
  });
}

// --- routing ---------------------------------------------------------------------------

function route(): void {
  const hash = location.hash || "#/";
  if (hash === "#/signin") return signInPage();
  const m = /^#\/lease\/([^/]+)$/.exec(hash);
  if (m) return leasePage(decodeURIComponent(m[1]));
  overviewPage();
}

api.setOnUnauthorized(() => {
  if (location.hash === "#/signin") return;
  afterSignIn = location.hash || "#/";
  cleanup();
  location.hash = "#/signin";
});
window.addEventListener("hashchange", route);
route();
