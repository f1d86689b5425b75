// A TCP connection to a port inside a lease over the daemon's port-forward websocket
// (GET /v1/leases/{id}/port-forward/{port}): binary messages carry the stream both ways.
import type { Duplex } from "node:stream";
import WebSocket, { createWebSocketStream, type ClientOptions } from "ws";
import { errorFromReply, withHint } from "./errors.js";
import { leasePath, readAll, type Client, type LeaseHandle } from "./client.js";

/** The websocket subprotocol of the port-forward route. */
export const PORT_FORWARD_PROTOCOL = "sidecar.port-forward.v1";

/** dialPortForward opens the websocket on c (the lease's daemon) and resolves with its
 * stream once upgraded; a refused upgrade rejects with the daemon's typed error. */
export function dialPortForward(lease: LeaseHandle, c: Client, port: number): Promise<Duplex> {
  const url = new URL(c.base.toString());
  url.protocol = "wss:";
  url.pathname = c.base.pathname.replace(/\/$/, "") + leasePath(lease.id, "port-forward", String(port));
  const token = lease.credential() || c.token;
  // servername: a DNS fleet's member is dialled by address, verified by the name.
  const opts: ClientOptions & { servername?: string } = {
    headers: { authorization: `Bearer ${token}` },
    ca: c.ca,
    servername: c.servername,
    maxPayload: 16 << 20,
    perMessageDeflate: false,
  };
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, [PORT_FORWARD_PROTOCOL], opts);
    ws.binaryType = "nodebuffer";
    ws.on("unexpected-response", (_req, res) => {
      readAll(res, 64 << 10).then(
        (b) => reject(errorFromReply(res.statusCode ?? 0, res.headers["content-type"], b)),
        reject,
      );
    });
    const fail = (err: Error) => reject(withHint(err));
    ws.once("error", fail);
    ws.on("open", () => {
      ws.off("error", fail);
      // Writes go out as binary messages; ending the stream closes the websocket, and
      // the daemon's close ends it.
      resolve(createWebSocketStream(ws));
    });
  });
}
