// xterm.js adds <style> elements at run time. The page's Content-Security-Policy allows
// a style element only with the nonce the daemon drew for this page load, so every style
// element made here gets it; no 'unsafe-inline' is needed.
const nonce = document.querySelector<HTMLMetaElement>('meta[name="csp-nonce"]')?.content ?? "";
const create = Document.prototype.createElement;
Document.prototype.createElement = function (this: Document, tag: string, options?: ElementCreationOptions) {
  const el = create.call(this, tag, options);
  if (nonce && tag.toLowerCase() === "style") (el as HTMLStyleElement).nonce = nonce;
  return el;
} as typeof Document.prototype.createElement;
