// A line chart on a canvas: small, no library, drawn from the samples given.

export function lineChart(title: string, points: { t: number; v: number }[], limit: number | undefined, fmt: (n: number) => string): HTMLElement {
  const wrap = document.createElement("figure");
  wrap.className = "chart";
  const cap = document.createElement("figcaption");
  const last = points.length ? fmt(points[points.length - 1].v) : "—";
  cap.textContent = `${title}: ${last}${limit ? " (limit " + fmt(limit) + ")" : ""}`;
  const c = document.createElement("canvas");
  const W = 320, H = 90;
  c.width = W * devicePixelRatio;
  c.height = H * devicePixelRatio;
  c.style.width = `${W}px`;
  c.style.height = `${H}px`;
  wrap.append(cap, c);
  const g = c.getContext("2d");
  if (points.length === 0) cap.textContent += " — collecting samples";
  if (!g || points.length === 0) return wrap;
  g.scale(devicePixelRatio, devicePixelRatio);
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const vmax = Math.max(limit ?? 0, ...points.map((p) => p.v), 1e-9);
  const x = (t: number) => ((t - t0) / Math.max(1, t1 - t0)) * (W - 4) + 2;
  const y = (v: number) => H - 2 - (v / vmax) * (H - 6);
  g.strokeStyle = "#888";
  g.strokeRect(0.5, 0.5, W - 1, H - 1);
  if (limit) {
    g.strokeStyle = "#c33";
    g.setLineDash([4, 3]);
    g.beginPath();
    g.moveTo(0, y(limit));
    g.lineTo(W, y(limit));
    g.stroke();
    g.setLineDash([]);
  }
  g.strokeStyle = "#2a6";
  g.lineWidth = 1.5;
  g.beginPath();
  points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.v)) : g.moveTo(x(p.t), y(p.v))));
  if (points.length === 1) g.lineTo(W - 2, y(points[0].v)); // one sample: its level
  g.stroke();
  return wrap;
}
