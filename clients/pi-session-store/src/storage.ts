import {
  InMemorySessionStorage,
  SessionError,
  type SessionEntryCursorOptions,
  type SessionStats,
  type SessionStorage,
  type SessionTreeEntry,
} from "@earendil-works/pi-agent-core";
import { StoreConflictError } from "./errors.js";
import type { NatsSessionMetadata } from "./metadata.js";

/** Appender is the one write a session storage needs from the store. */
export interface Appender {
  /**
   * append writes line (the entry's JSON, exactly) as the next entry of conversation id,
   * provided the store's head is expectedHead; it returns the new head. A refusal throws
   * a StoreError (StoreConflictError when the head differs); a lost reply is retried by
   * the implementation with the same bytes, which the store acknowledges once.
   */
  append(id: string, entryId: string, line: string, expectedHead: string | null): Promise<string | null>;
}

// leafAfter is Pi's leaf rule: an ordinary entry makes itself the leaf, a `leaf` record
// its targetId.
function leafAfter(entry: SessionTreeEntry): string | null {
  return entry.type === "leaf" ? entry.targetId : entry.id;
}

/**
 * NatsSessionStorage is Pi's SessionStorage for one conversation of the pisync session
 * store. Reads are served from Pi's own in-memory index (InMemorySessionStorage), built
 * from the entries `open` returned; appends go to the store first, and the index moves
 * only when the store said ok, so a refused append leaves this runtime's view as it was.
 *
 * The store's head must equal the index's leaf: when `open` finds them different (the
 * head names an entry the index puts elsewhere), or after a conflict, appends are refused
 * until the session is opened again.
 */
export class NatsSessionStorage implements SessionStorage<NatsSessionMetadata> {
  private readonly index: InMemorySessionStorage<NatsSessionMetadata>;
  private leaf: string | null;
  private stale: StoreConflictError | undefined;
  // Appends run one after the other, each on the leaf the previous one made.
  private queue: Promise<unknown> = Promise.resolve();

  /**
   * The constructor is for NatsSessionRepo: entries are the conversation's current
   * generation in store order, and head the store's head at the time they were read.
   */
  constructor(
    private readonly appender: Appender,
    private readonly metadata: NatsSessionMetadata,
    entries: SessionTreeEntry[],
    head: string | null,
  ) {
    this.index = new InMemorySessionStorage<NatsSessionMetadata>({ entries, metadata });
    this.leaf = null;
    for (const entry of entries) this.leaf = leafAfter(entry);
    if (this.leaf !== head) {
      this.stale = new StoreConflictError(
        `session ${metadata.id}: the leaf of its entries (${this.leaf}) is not the store's head (${head}); refusing to append`,
        head,
      );
    }
  }

  async getMetadata(): Promise<NatsSessionMetadata> {
    return this.metadata;
  }

  async getLeafId(): Promise<string | null> {
    return this.index.getLeafId();
  }

  /** setLeafId appends a `leaf` record, as Pi's JsonlSessionStorage does. */
  async setLeafId(leafId: string | null): Promise<void> {
    if (leafId !== null && !(await this.index.getEntry(leafId))) {
      throw new SessionError("not_found", `Entry ${leafId} not found`);
    }
    // The same fields in the same order as JsonlSessionStorage.setLeafId, so that the
    // line is the one Pi's JSONL backend would write.
    const entry: SessionTreeEntry = {
      type: "leaf",
      id: await this.createEntryId(),
      parentId: this.leaf,
      timestamp: new Date().toISOString(),
      targetId: leafId,
    };
    await this.appendEntry(entry);
  }

  async createEntryId(): Promise<string> {
    return this.index.createEntryId();
  }

  /**
   * appendEntry writes the entry to the store, on the condition that the store's head is
   * this storage's leaf, and only then adds it to the index.
   */
  async appendEntry(entry: SessionTreeEntry): Promise<void> {
    const run = this.queue.then(() => this.appendNow(entry));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async appendNow(entry: SessionTreeEntry): Promise<void> {
    if (this.stale) throw this.stale;
    const line = JSON.stringify(entry);
    try {
      await this.appender.append(this.metadata.id, entry.id, line, this.leaf);
    } catch (err) {
      if (err instanceof StoreConflictError) this.stale = err;
      throw err;
    }
    // The index keeps what a reader of the store gets back: the parsed line (the entry
    // object may hold undefined fields that the line does not).
    await this.index.appendEntry(JSON.parse(line) as SessionTreeEntry);
    this.leaf = leafAfter(entry);
  }

  async getEntry(id: string): Promise<SessionTreeEntry | undefined> {
    return this.index.getEntry(id);
  }

  async findEntries<TType extends SessionTreeEntry["type"]>(
    type: TType,
  ): Promise<Array<Extract<SessionTreeEntry, { type: TType }>>> {
    return this.index.findEntries(type);
  }

  async getLabel(id: string): Promise<string | undefined> {
    return this.index.getLabel(id);
  }

  async getSessionName(): Promise<string | undefined> {
    return this.index.getSessionName();
  }

  async getSessionStats(): Promise<SessionStats> {
    return this.index.getSessionStats();
  }

  async getPathToRootOrCompaction(leafId: string | null): Promise<SessionTreeEntry[]> {
    return this.index.getPathToRootOrCompaction(leafId);
  }

  async getEntries(options?: SessionEntryCursorOptions): Promise<SessionTreeEntry[]> {
    return this.index.getEntries(options);
  }
}
