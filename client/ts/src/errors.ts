// Problem codes of the wire contract as typed errors: every error reply becomes an
// instance of the class of its code, all of them SidecarError.
import type { components } from "./openapi.js";

export type Problem = components["schemas"]["Problem"];
export type ProblemCode = Problem["code"];

/** An error reply of the daemon (RFC 9457 problem details with a stable code). */
export class SidecarError extends Error {
  readonly status: number;
  readonly code: ProblemCode;
  readonly title: string;
  readonly detail?: string;
  readonly line?: number;
  readonly column?: number;

  constructor(status: number, p: Partial<Problem> & { code: ProblemCode }) {
    super(`sidecar: ${p.title ?? status}${p.detail ? ": " + p.detail : ""} [${status} ${p.code}]`);
    this.name = new.target.name;
    this.status = status;
    this.code = p.code;
    this.title = p.title ?? "";
    this.detail = p.detail;
    this.line = p.line;
    this.column = p.column;
  }
}

export class UnauthorizedError extends SidecarError {}
export class ForbiddenError extends SidecarError {}
export class InvalidRequestError extends SidecarError {}
export class NotFoundError extends SidecarError {}
export class LeaseNotFoundError extends NotFoundError {}
export class ProcessNotFoundError extends NotFoundError {}
export class LeaseExpiredError extends SidecarError {}
export class LeaseLimitError extends SidecarError {}
export class PathOutsideWorkdirError extends SidecarError {}
export class NotADirectoryError extends SidecarError {}
export class IsADirectoryError extends SidecarError {}
export class ExistsError extends SidecarError {}
export class QuotaExceededError extends SidecarError {}
export class DigestMismatchError extends SidecarError {}
export class PayloadTooLargeError extends SidecarError {}
export class CapabilityError extends SidecarError {}
export class ScriptError extends SidecarError {}
export class ScriptTimeoutError extends SidecarError {}
export class UnavailableError extends SidecarError {}
export class InternalError extends SidecarError {}
export class MethodNotAllowedError extends SidecarError {}
export class HeaderTooLargeError extends SidecarError {}
export class ConflictError extends SidecarError {}
export class RangeNotSatisfiableError extends SidecarError {}
export class PreconditionFailedError extends SidecarError {}
export class ExecLimitError extends SidecarError {}
export class OldTextNotFoundError extends SidecarError {}
export class OldTextNotUniqueError extends SidecarError {}
export class SandboxSetupFailedError extends SidecarError {}
/** 503 draining: the sidecar takes no new lease; place it on another one. */
export class DrainingError extends UnavailableError {}
export class ShellNotFoundError extends NotFoundError {}
export class ShellBusyError extends SidecarError {}
/** 400 invalid_network_policy: an entry the daemon cannot read, or one inside a range only
 * the operator's SIDECAR_NETWORK_PRIVATE_ALLOW opens; the detail names it. */
export class InvalidNetworkPolicyError extends InvalidRequestError {}
/** 502 port_unreachable: nothing listens on that port inside the lease. */
export class PortUnreachableError extends SidecarError {}
/** 429 search_limit: the lease or the daemon runs as many greps as it may, or the
 * daemon's search memory budget cannot hold the pattern; retry shortly. */
export class SearchLimitError extends SidecarError {}
/** 400 pattern_too_complex: the grep pattern compiles to over 10,000 instructions. */
export class PatternTooComplexError extends InvalidRequestError {}
/** 429 watch_limit: the lease's or the daemon's inotify budget is spent. */
export class WatchLimitError extends SidecarError {}
/** 400 unknown_image: an acquire names an image that is not one of the operator's. */
export class UnknownImageError extends InvalidRequestError {}
/** 503 image_not_ready: the image is being pulled, failed to pull, or was removed; retry
 * after the reply's Retry-After. */
export class ImageNotReadyError extends UnavailableError {}
/** 409 image_in_use: an image cannot be removed while leases run on it. */
export class ImageInUseError extends ConflictError {}
/** 422 snapshot_refused: the lease holds what an image layer cannot (a file named .wh.*);
 * the detail names it. */
export class SnapshotRefusedError extends SidecarError {}

/** The class of every code; the Record type makes a code added to the document without
 * a class here a compile error. */
export const errorClasses: Record<ProblemCode, new (status: number, p: Partial<Problem> & { code: ProblemCode }) => SidecarError> = {
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  invalid_request: InvalidRequestError,
  not_found: NotFoundError,
  lease_not_found: LeaseNotFoundError,
  lease_expired: LeaseExpiredError,
  lease_limit: LeaseLimitError,
  process_not_found: ProcessNotFoundError,
  path_outside_workdir: PathOutsideWorkdirError,
  not_a_directory: NotADirectoryError,
  is_a_directory: IsADirectoryError,
  exists: ExistsError,
  quota_exceeded: QuotaExceededError,
  digest_mismatch: DigestMismatchError,
  payload_too_large: PayloadTooLargeError,
  capability_disabled: CapabilityError,
  script_error: ScriptError,
  script_timeout: ScriptTimeoutError,
  unavailable: UnavailableError,
  internal: InternalError,
  method_not_allowed: MethodNotAllowedError,
  header_too_large: HeaderTooLargeError,
  conflict: ConflictError,
  range_not_satisfiable: RangeNotSatisfiableError,
  precondition_failed: PreconditionFailedError,
  exec_limit: ExecLimitError,
  old_text_not_found: OldTextNotFoundError,
  old_text_not_unique: OldTextNotUniqueError,
  sandbox_setup_failed: SandboxSetupFailedError,
  draining: DrainingError,
  shell_not_found: ShellNotFoundError,
  shell_busy: ShellBusyError,
  invalid_network_policy: InvalidNetworkPolicyError,
  port_unreachable: PortUnreachableError,
  search_limit: SearchLimitError,
  pattern_too_complex: PatternTooComplexError,
  watch_limit: WatchLimitError,
  unknown_image: UnknownImageError,
  image_not_ready: ImageNotReadyError,
  image_in_use: ImageInUseError,
  snapshot_refused: SnapshotRefusedError,
};

// A code for replies without a problem body (HEAD, a proxy in between).
const codeByStatus: Record<number, ProblemCode> = {
  400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
  405: "method_not_allowed", 409: "conflict", 410: "lease_expired", 413: "payload_too_large",
  416: "range_not_satisfiable", 429: "lease_limit", 431: "header_too_large",
  500: "internal", 502: "unavailable", 503: "unavailable", 504: "unavailable", 507: "quota_exceeded",
};

/** errorFromReply builds the typed error of an error reply. */
export function errorFromReply(status: number, contentType: string | undefined, body: Buffer): SidecarError {
  const mt = (contentType ?? "").split(";")[0].trim().toLowerCase();
  if (body.length > 0 && (mt === "application/problem+json" || mt === "application/json")) {
    try {
      const p = JSON.parse(body.toString("utf8")) as Partial<Problem>;
      if (p.code && p.code in errorClasses) {
        return new errorClasses[p.code](status, { ...p, code: p.code });
      }
    } catch {
      // not a problem body: fall through
    }
  }
  const code = codeByStatus[status] ?? (status < 500 ? "invalid_request" : "internal");
  return new errorClasses[code](status, { code, title: `HTTP ${status}` });
}

// Node's codes for a certificate chain that does not end at a trusted CA.
const unknownCACodes = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "SELF_SIGNED_CERT_IN_CHAIN", "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_GET_ISSUER_CERT", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "CERT_UNTRUSTED",
]);

/** withHint adds to a connection error the setting that fixes it, when it is one of the
 * usual ones (an untrusted CA, a certificate for another host, a refused connection); the
 * error keeps its class and its code. */
export function withHint<E>(err: E): E {
  if (!(err instanceof Error)) return err;
  const code = (err as NodeJS.ErrnoException).code ?? "";
  let hint = "";
  if (unknownCACodes.has(code)) {
    hint = "the daemon's certificate is signed by a CA this client does not trust: set SANDBOX_REMOTE_CA_FILE " +
      "(the ca option) to the daemon's CA certificate (the ca.crt `sidecar serve` printed, or the one `sidecar tls gen` made)";
  } else if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
    hint = "the daemon's certificate does not name the host in the URL: connect by a name it lists, or add this one " +
      "to SIDECAR_TLS_HOSTS on the daemon (self-signed certificates) or to `sidecar tls gen --host/--ip`";
  } else if (code === "ECONNREFUSED") {
    hint = "nothing accepts connections there: check SANDBOX_REMOTE_URL (the url option) and that the daemon runs";
  }
  if (hint !== "" && !err.message.includes(hint)) err.message += ` (${hint})`;
  return err;
}
