import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { SessionTreeEntry } from "@earendil-works/pi-agent-core";
import { RequestError, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import { StoreConflictError, StoreError } from "./errors.js";
import {
  InlineLimit,
  PartSize,
  subject,
  type AppendReply,
  type Op,
  type OpenReply,
  type PartReply,
  type Reply,
  type UploadReply,
  type WireEntry,
} from "./protocol.js";
import type { Appender } from "./storage.js";

/** ClientOptions tune how StoreClient talks to pisync serve. */
export interface ClientOptions {
  /** Subject prefix of the deployment (default "pisync"). */
  prefix?: string;
  /** Milliseconds one request waits for its reply (default 5000). */
  timeoutMs?: number;
  /**
   * Attempts of one request when it gets no reply or `unavailable` (default 5). Every
   * request is safe to send again: append is idempotent by entry id, create by header
   * bytes, and reads have no effect.
   */
  attempts?: number;
}

/** Opened is what `open` read: the first reply (meta, head) and the entries in order. */
export interface Opened {
  reply: OpenReply;
  entries: SessionTreeEntry[];
}

/** openParallel bounds the page requests one open has in flight. */
const openParallel = 4;

/** maxGuesses bounds the pages one open asks for ahead (about 4 GB of session at 1 MB). */
const maxGuesses = 4096;

/**
 * StoreClient sends the requests of docs/store-protocol.md for one tenant and owner over a
 * NATS connection, and turns failed replies into StoreErrors.
 */
export class StoreClient implements Appender {
  readonly prefix: string;
  private readonly timeoutMs: number;
  private readonly attempts: number;

  constructor(
    readonly nc: NatsConnection,
    readonly tenant: string,
    readonly owner: string,
    options: ClientOptions = {},
  ) {
    this.prefix = options.prefix ?? "pisync";
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.attempts = Math.max(1, options.attempts ?? 5);
  }

  /**
   * call sends body to op and returns the successful reply. No reply (timeout, no
   * responders) and `unavailable` are retried with the same bytes, with backoff; any
   * other error reply throws at once.
   */
  async call<T extends Reply>(op: Op, body: object): Promise<T> {
    const subj = subject(this.prefix, this.tenant, this.owner, op);
    const payload = JSON.stringify(body);
    let last: StoreError | undefined;
    for (let attempt = 0; attempt < this.attempts; attempt++) {
      if (attempt > 0) await sleep(Math.min(1000, 25 * 2 ** attempt));
      let reply: T;
      try {
        const msg = await this.nc.request(subj, payload, { timeout: this.timeoutMs });
        reply = msg.json<T>();
      } catch (err) {
        if (!noReply(err)) throw err;
        last = new StoreError("unavailable", `${op}: no reply from pisync serve on ${subj}: ${String(err)}`, err as Error);
        continue;
      }
      if (reply.ok) return reply;
      const e = reply.error ?? { code: "unavailable" as const, message: "reply without error" };
      const message = `${op}: ${e.message ?? e.code}`;
      if (e.code === "conflict") {
        const conflict = new StoreConflictError(message, e.head ?? null, e.reason);
        conflict.afterNoReply = last !== undefined;
        throw conflict;
      }
      last = new StoreError(e.code, message);
      if (e.code !== "unavailable") throw last;
    }
    throw last ?? new StoreError("unavailable", `${op}: no attempt made`);
  }

  async append(id: string, _entryId: string, line: string, expectedHead: string | null): Promise<string | null> {
    const bytes = Buffer.from(line, "utf8");
    const { inline, part } = this.limits();
    let reply: AppendReply;
    if (bytes.length <= inline) {
      reply = await this.call<AppendReply>("append", { id, expectedHead, line });
    } else {
      const sha256 = createHash("sha256").update(bytes).digest("hex");
      for (let offset = 0; offset < bytes.length; offset += part) {
        const data = bytes.subarray(offset, offset + part).toString("base64");
        await this.call<UploadReply>("append", { id, part: { sha256, size: bytes.length, offset, data } });
      }
      reply = await this.call<AppendReply>("append", { id, expectedHead, blob: { sha256, size: bytes.length } });
    }
    return reply.head;
  }

  /**
   * limits are the largest line sent inline and the largest part uploaded, for the
   * server's max_payload: a line's JSON string can be twice its bytes (quotes escaped),
   * a part's base64 is four thirds of it, and the request has its other fields.
   */
  private limits(): { inline: number; part: number } {
    const room = (this.nc.info?.max_payload ?? 1024 * 1024) - 4096;
    return { inline: Math.min(InlineLimit, Math.floor(room / 2)), part: Math.min(PartSize, Math.floor(room / 4) * 3) };
  }

  /**
   * open reads the current generation of conversation id: every entry, parsed, in order.
   *
   * The store answers in pages of about 1 MB, each continuing after the last ordinal of
   * the one before. Waiting for each page before asking for the next makes a long session
   * cost one round trip per page, so the pages after the first are asked for at once
   * (at most `openParallel` at a time), at the ordinals they would start at were every page
   * as long as the first; the replies are then stitched by ordinal, and wherever a guess
   * missed, the page is asked for where the previous one really ended.
   */
  async open(id: string): Promise<Opened> {
    const first = await this.call<OpenReply>("open", { id });
    const snap = { id, generation: first.generation, lastSeq: first.lastSeq };
    const at = (after: number) => this.call<OpenReply>("open", { ...snap, after });
    const guesses: Array<{ after: number; reply: Promise<OpenReply | undefined> }> = [];
    if (first.next && first.entries.length > 0) {
      const per = first.entries.length;
      const count = Math.min(Math.ceil(Math.max(0, (first.meta.entries ?? 0) - per) / per), maxGuesses);
      for (let k = 0; k < count; k++) {
        const after = first.next.after + k * per;
        // A guess starts once the one openParallel places before it has settled.
        const before = k >= openParallel ? guesses[k - openParallel]!.reply : Promise.resolve(undefined);
        // A failed guess is no failure of the open: that page is asked for again.
        guesses.push({ after, reply: before.then(() => at(after)).catch(() => undefined) });
      }
    }
    const entries: SessionTreeEntry[] = [];
    const take = async (reply: OpenReply, after: number) => {
      for (const entry of reply.entries) {
        if (entry.ordinal > after) entries.push(parseEntry(id, entry.ordinal, await this.line(id, first, entry)));
      }
    };
    await take(first, 0);
    let cur = first.next?.after;
    let g = 0;
    while (cur !== undefined) {
      // The nearest guess starting at or before cur serves if its page reaches past cur.
      while (g + 1 < guesses.length && guesses[g + 1]!.after <= cur) g++;
      let reply: OpenReply | undefined;
      if (guesses[g] && guesses[g]!.after <= cur) {
        const r = await guesses[g]!.reply;
        if (r && (r.next?.after ?? Infinity) > cur) reply = r;
      }
      reply ??= await at(cur);
      await take(reply, cur);
      cur = reply.next?.after;
    }
    return { reply: first, entries };
  }

  private async line(id: string, snap: OpenReply, entry: WireEntry): Promise<string> {
    if (entry.raw) {
      throw new StoreError("invalid", `session ${id}: entry ${entry.ordinal} is not a JSON line (Pi's JSONL loader refuses such a session too)`);
    }
    if (entry.line !== undefined) return entry.line;
    const parts: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const part = await this.call<PartReply>("open", {
        id,
        generation: snap.generation,
        lastSeq: snap.lastSeq,
        ordinal: entry.ordinal,
        offset,
      });
      const data = Buffer.from(part.data, "base64");
      parts.push(data);
      offset += data.length;
      if (part.eof) break;
      if (data.length === 0) throw new StoreError("invalid", `session ${id}: entry ${entry.ordinal}: empty part before its end`);
    }
    const bytes = Buffer.concat(parts);
    if (entry.sha256) {
      const got = createHash("sha256").update(bytes).digest("hex");
      if (got !== entry.sha256) {
        throw new StoreError("invalid", `session ${id}: entry ${entry.ordinal}: sha256 ${got}, the store said ${entry.sha256}`);
      }
    }
    return bytes.toString("utf8");
  }
}

function parseEntry(id: string, ordinal: number, line: string): SessionTreeEntry {
  try {
    return JSON.parse(line) as SessionTreeEntry;
  } catch (err) {
    throw new StoreError("invalid", `session ${id}: entry ${ordinal} is not valid JSON`, err as Error);
  }
}

// noReply tells a request that got no answer (it may or may not have been served) from
// one that failed for good.
function noReply(err: unknown): boolean {
  if (err instanceof TimeoutError) return true;
  if (err instanceof RequestError) return err.isNoResponders() || err.cause instanceof TimeoutError;
  return false;
}
