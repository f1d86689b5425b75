// A few helpers that build DOM nodes; text always goes in as text, never as HTML.

type Child = Node | string | number | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string | boolean | ((e: Event) => void)> = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else if (v === true) el.setAttribute(k, "");
    else if (v !== false) el.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "object" ? c : String(c));
  }
  return el;
}

export function bytes(n: number | undefined): string {
  if (n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
}

export function since(iso: string): number {
  return (Date.now() - Date.parse(iso)) / 1000;
}

export function until(iso: string): number {
  return (Date.parse(iso) - Date.now()) / 1000;
}

// meter is "used / limit" with a bar; no limit shows the use alone.
export function meter(used: number | undefined, limit: number | undefined, fmt: (n: number) => string): HTMLElement {
  const text = `${used === undefined ? "—" : fmt(used)}${limit ? " / " + fmt(limit) : ""}`;
  const el = h("div", { class: "meter" }, h("span", {}, text));
  if (used !== undefined && limit) {
    const pct = Math.min(100, (used / limit) * 100);
    const bar = h("div", { class: "bar" + (pct > 90 ? " hot" : "") });
    bar.style.width = `${pct.toFixed(1)}%`;
    el.prepend(bar);
  }
  return el;
}

// confirmDialog asks a yes/no question in a modal; it resolves true on yes.
export function confirmDialog(question: string, yes: string): Promise<boolean> {
  return new Promise((resolve) => {
    const dlg = h("dialog", { class: "confirm" });
    const done = (v: boolean) => {
      dlg.close();
      dlg.remove();
      resolve(v);
    };
    dlg.append(
      h("p", {}, question),
      h("div", { class: "actions" },
        h("button", { type: "button", onclick: () => done(false) }, "Cancel"),
        h("button", { type: "button", class: "danger", onclick: () => done(true) }, yes)),
    );
    dlg.addEventListener("cancel", () => done(false));
    document.body.append(dlg);
    dlg.showModal();
  });
}
