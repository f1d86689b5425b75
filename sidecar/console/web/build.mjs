// Builds the console into ../dist, which the daemon embeds: app.js (TypeScript and
// xterm.js in one minified bundle), app.css (ours and xterm's) and index.html.
// With --check it builds into a scratch directory instead and fails when ../dist
// differs: the committed bundle is stale (run `make console`).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const dist = "../dist";
const check = process.argv.includes("--check");
const out = check ? mkdtempSync(join(tmpdir(), "sidecar-console-")) : dist;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["src/main.ts"],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2022",
  legalComments: "eof",
  outfile: `${out}/app.js`,
  logLevel: "warning",
});
const css = readFileSync("node_modules/@xterm/xterm/css/xterm.css", "utf8") + "\n" + readFileSync("src/app.css", "utf8");
writeFileSync(`${out}/app.css`, css);
copyFileSync("index.html", `${out}/index.html`);

if (check) {
  const names = (d) => readdirSync(d).sort().join(",");
  const stale = names(out) !== names(dist) || readdirSync(out).some((f) => !readFileSync(join(out, f)).equals(readFileSync(join(dist, f))));
  rmSync(out, { recursive: true, force: true });
  if (stale) {
    console.error("sidecar/console/dist is not what sidecar/console/web builds: run `make console` and commit it");
    process.exit(1);
  }
}
