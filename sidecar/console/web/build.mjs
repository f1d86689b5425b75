// Builds the console into ../dist, which the daemon embeds: app.js (TypeScript and
// xterm.js in one minified bundle), app.css (ours and xterm's) and index.html.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";

const out = "../dist";
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
