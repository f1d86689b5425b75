// Lease images and snapshots through the TypeScript client, against a real daemon whose
// one image is an OCI layout this test writes: a static busybox as /bin/sh.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ExistsError, ImageInUseError, UnknownImageError } from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

// ociLayout writes an OCI layout holding one image, tagged tag, whose one layer is the
// directory rootfs.
function ociLayout(dir: string, tag: string, rootfs: string): void {
  mkdirSync(join(dir, "blobs", "sha256"), { recursive: true });
  const blob = (b: Buffer) => {
    const digest = "sha256:" + createHash("sha256").update(b).digest("hex");
    writeFileSync(join(dir, "blobs", "sha256", digest.slice(7)), b);
    return { digest, size: b.length };
  };
  const layer = blob(execFileSync("tar", ["-C", rootfs, "--owner=0", "--group=0", "-cf", "-", "."], { maxBuffer: 64 << 20 }));
  const arch = process.arch === "x64" ? "amd64" : process.arch;
  const config = blob(Buffer.from(JSON.stringify({
    architecture: arch, os: "linux", config: { Env: ["PATH=/bin"] }, rootfs: { type: "layers", diff_ids: [layer.digest] },
  })));
  const manifest = blob(Buffer.from(JSON.stringify({
    schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
    layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar", ...layer }],
  })));
  writeFileSync(join(dir, "index.json"), JSON.stringify({
    schemaVersion: 2,
    manifests: [{ mediaType: "application/vnd.oci.image.manifest.v1+json", ...manifest, annotations: { "org.opencontainers.image.ref.name": tag } }],
  }));
  writeFileSync(join(dir, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
}

let d: Daemon;
let work: string;
before(async () => {
  work = mkdtempSync("/var/tmp/sidecar-ts-image-");
  chmodSync(work, 0o755);
  const rootfs = join(work, "rootfs");
  mkdirSync(join(rootfs, "bin"), { recursive: true });
  copyFileSync("/bin/busybox", join(rootfs, "bin", "busybox")); // busybox-static: .ci/run installs it
  chmodSync(join(rootfs, "bin", "busybox"), 0o755);
  symlinkSync("busybox", join(rootfs, "bin", "sh"));
  for (const dir of ["tmp", "opt"]) {
    mkdirSync(join(rootfs, dir));
    chmodSync(join(rootfs, dir), 0o1777); // world-writable: a plain lease writes there
  }
  ociLayout(join(work, "layout"), "bb", rootfs);
  d = await startDaemon({ env: { SIDECAR_IMAGES: `bb=oci-layout:${join(work, "layout")}:bb`, SIDECAR_IMAGE_STORE_BYTES: String(256 << 20) } });
});
after(async () => {
  await d?.stop();
  rmSync(work, { recursive: true, force: true }); // plain files: no lease ever mounts here
});

test("a lease's snapshot starts leases as it left them", { timeout: 120_000, skip: process.getuid?.() !== 0 && "images need root (CI runs as root)" }, async () => {
  const deadline = Date.now() + 60_000;
  while ((await d.client.listImages()).images.find((i) => i.name === "bb")?.state !== "ready") {
    if (Date.now() > deadline) throw new Error("image bb never became ready");
    await new Promise((r) => setTimeout(r, 50));
  }
  const src = await d.client.acquire({ session_id: "ts-snapshot-source", image: "bb" });
  const made = await src.exec({ argv: ["sh", "-c", "echo cloned > /workspace/README && echo tool > /opt/tool"] });
  assert.equal(made.exit_code, 0, made.stderr);

  const snap = await src.snapshot("bb-prepared");
  assert.equal(snap.state, "ready");
  assert.equal(snap.snapshot?.base, "bb");
  assert.equal(snap.snapshot?.lease, src.id);
  await assert.rejects(src.snapshot("bb-prepared"), ExistsError);

  const l = await d.client.acquire({ session_id: "ts-snapshot-start", image: "bb-prepared" });
  const r = await l.exec({ argv: ["sh", "-c", "cat /workspace/README /opt/tool"] });
  assert.equal(r.stdout, "cloned\ntool\n", r.stderr);
  assert.equal((await l.readFile("README")).toString(), "cloned\n");

  await assert.rejects(d.client.removeImage("bb-prepared"), ImageInUseError);
  await l.release();
  await d.client.removeImage("bb-prepared");
  await assert.rejects(d.client.acquire({ session_id: "ts-snapshot-gone", image: "bb-prepared" }), UnknownImageError);
  await src.release();
});
