// The v5.channel.k8s.io framing of the daemon's process websockets (docs/api.md,
// "Websocket framing"): the first byte of each binary message is its channel.

export const PROTOCOL = "v5.channel.k8s.io";
const enc = new TextEncoder();

export interface Handlers {
  output(data: Uint8Array): void;
  status(s: { status: string; exit_code?: number; signal?: string }): void;
  closed(reason: string): void;
}

// openStream opens a process websocket at path (with its query); the session cookie
// authenticates it, the daemon checks that its Origin is the daemon's own.
export function openStream(path: string, hd: Handlers): WebSocket {
  const ws = new WebSocket(`wss://${location.host}${path}`, [PROTOCOL]);
  ws.binaryType = "arraybuffer";
  ws.onmessage = (ev) => {
    if (!(ev.data instanceof ArrayBuffer) || ev.data.byteLength === 0) return;
    const b = new Uint8Array(ev.data);
    if (b[0] === 1 || b[0] === 2) hd.output(b.subarray(1));
    else if (b[0] === 3) {
      try {
        hd.status(JSON.parse(new TextDecoder().decode(b.subarray(1))));
      } catch {
        // a malformed status is only not shown
      }
    }
  };
  ws.onclose = (ev) => hd.closed(ev.reason || `closed (${ev.code})`);
  return ws;
}

function frame(channel: number, payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(payload.length + 1);
  out[0] = channel;
  out.set(payload, 1);
  return out;
}

export function sendStdin(ws: WebSocket, data: string): void {
  if (ws.readyState === WebSocket.OPEN) ws.send(frame(0, enc.encode(data)));
}

export function sendResize(ws: WebSocket, cols: number, rows: number): void {
  if (ws.readyState === WebSocket.OPEN) ws.send(frame(4, enc.encode(JSON.stringify({ Width: cols, Height: rows }))));
}
