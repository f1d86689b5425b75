// Output kept as a head and an end: a run-to-completion stream longer than the daemon's
// max_output_bytes comes back as its first output_head_bytes and its last bytes, with
// stdout_dropped bytes missing between them at stdout_dropped_at characters (Unicode
// code points) of stdout (docs/api.md, "Long output keeps its head and its end").

/** outputParts splits a stream of an exec's or shell command's result (stdout with
 * stdout_dropped and stdout_dropped_at, or stderr with its own) into the head and the end
 * around the dropped bytes; with nothing dropped the head is all of it. */
export function outputParts(out: string, dropped: number, at: number): { head: string; tail: string } {
  if (dropped === 0) return { head: out, tail: "" };
  let i = 0; // UTF-16 index after `at` code points
  for (let n = 0; n < at && i < out.length; n++) {
    i += (out.codePointAt(i) ?? 0) > 0xffff ? 2 : 1;
  }
  return { head: out.slice(0, i), tail: out.slice(i) };
}

/** droppedMarker is the line outputWithMarker puts where dropped bytes were. */
export function droppedMarker(dropped: number): string {
  return `\n[… ${dropped} bytes dropped …]\n`;
}

/** outputWithMarker is the output with a line saying how many bytes were dropped where
 * they were; for reading, not for parsing the output. */
export function outputWithMarker(out: string, dropped: number, at: number): string {
  if (dropped === 0) return out;
  const { head, tail } = outputParts(out, dropped, at);
  return head + droppedMarker(dropped) + tail;
}
