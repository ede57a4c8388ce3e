import { SessionError, type SessionErrorCode } from "@earendil-works/pi-agent-core";

/** StoreCode is the error code of a `pisync serve` reply (docs/store-protocol.md). */
export type StoreCode = "not_found" | "conflict" | "invalid" | "too_large" | "unavailable";

// Pi's callers branch on SessionError.code; the store's own code stays in storeCode.
const sessionCodes: Record<StoreCode, SessionErrorCode> = {
  not_found: "not_found",
  conflict: "storage",
  invalid: "invalid_entry",
  too_large: "invalid_entry",
  unavailable: "storage",
};

/**
 * StoreError is a refusal or failure of the session store. It is a Pi SessionError, so
 * code that handles Pi's errors handles it; storeCode says what the store replied.
 */
export class StoreError extends SessionError {
  /** The store's error code. */
  readonly storeCode: StoreCode;

  constructor(storeCode: StoreCode, message: string, cause?: Error) {
    super(sessionCodes[storeCode], message, cause);
    this.name = "StoreError";
    this.storeCode = storeCode;
  }
}

/**
 * StoreConflictError says the session's head in the store is not the leaf this runtime
 * appended on: another writer extended it, or this runtime's view is stale. Nothing was
 * written and the local index did not move; reopen the session to continue from head.
 */
export class StoreConflictError extends StoreError {
  /** The store's current head (null: the session has no entries yet). */
  readonly head: string | null;
  /** The store's reason: "head", "entry_exists" (append) or "exists" (create, fork). */
  readonly reason: string | undefined;
  /**
   * afterNoReply says that an earlier attempt of the same request got no reply: it may
   * have been served, and this conflict may be with that request's own effect.
   */
  afterNoReply = false;

  constructor(message: string, head: string | null, reason?: string) {
    super("conflict", message);
    this.name = "StoreConflictError";
    this.head = head;
    this.reason = reason;
  }
}
