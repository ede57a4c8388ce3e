import { isAbsolute, join } from "node:path";
import {
  Session,
  createSessionId,
  type SessionForkOptions,
  type SessionRepo,
  type SessionTreeEntry,
} from "@earendil-works/pi-agent-core";
import { connect, type NatsConnection, type NodeConnectionOptions } from "@nats-io/transport-node";
import { StoreClient, type ClientOptions } from "./client.js";
import type { NatsSessionCreateOptions, NatsSessionListOptions, NatsSessionMetadata } from "./metadata.js";
import type { CreateReply, ListReply, WireMeta } from "./protocol.js";
import { NatsSessionStorage } from "./storage.js";

/** Where the repository finds the store: its own connection, or one it is handed. */
export type NatsSessionRepoOptions = ClientOptions & {
  /** Tenant of the sessions (a subject token of the store). */
  tenant: string;
  /** Owner of the sessions: the store serves this owner's conversations only. */
  owner: string;
  /**
   * A sessions root: when set, `metadata.path` is the conversation's path in Pi's layout
   * under it (as Pi's JsonlSessionRepo on that root would give it); otherwise the path
   * relative to a sessions root that the store reports.
   */
  sessionsRoot?: string;
} & (
    | { connection: NatsConnection; servers?: never }
    | ({ connection?: never; servers: string | string[] } & Omit<NodeConnectionOptions, "servers">)
  );

/**
 * NatsSessionRepo is Pi's SessionRepo on the pisync session store (`pisync serve`): the
 * same operations and metadata as Pi's JsonlSessionRepo, the lines it would write, but
 * kept in NATS JetStream, with the store's owner, idempotency and head checks on every
 * append.
 *
 * Give it `servers` (and any option of the NATS client: user, pass, token,
 * authenticator, tls, inboxPrefix …) and it connects on first use and closes the
 * connection on close(); give it a `connection` and it uses that one and leaves it open.
 */
export class NatsSessionRepo implements SessionRepo<NatsSessionMetadata, NatsSessionCreateOptions, NatsSessionListOptions> {
  private client: Promise<StoreClient> | undefined;
  private readonly ownsConnection: boolean;

  constructor(private readonly options: NatsSessionRepoOptions) {
    if (!options.tenant || !options.owner) throw new TypeError("NatsSessionRepo needs a tenant and an owner");
    if (!options.connection && !options.servers) throw new TypeError("NatsSessionRepo needs servers or a connection");
    this.ownsConnection = !options.connection;
  }

  private store(): Promise<StoreClient> {
    this.client ??= (async () => {
      const { tenant, owner, prefix, timeoutMs, attempts, sessionsRoot: _root, connection, ...natsOptions } = this.options;
      const nc = connection ?? (await connect(natsOptions as NodeConnectionOptions));
      return new StoreClient(nc, tenant, owner, { prefix, timeoutMs, attempts });
    })();
    return this.client;
  }

  /** close closes the connection the repository opened itself (not one it was given). */
  async close(): Promise<void> {
    if (!this.client || !this.ownsConnection) return;
    const client = await this.client.catch(() => undefined);
    this.client = undefined;
    await client?.nc.close();
  }

  async create(options: NatsSessionCreateOptions): Promise<Session<NatsSessionMetadata>> {
    const store = await this.store();
    const id = options.id ?? createSessionId();
    const reply = await store.call<CreateReply>("create", { line: headerLine(id, options) });
    return this.session(store, reply.meta, [], null);
  }

  async open(metadata: NatsSessionMetadata): Promise<Session<NatsSessionMetadata>> {
    const store = await this.store();
    const { reply, entries } = await store.open(metadata.id);
    return this.session(store, reply.meta, entries, reply.head);
  }

  async list(options?: NatsSessionListOptions): Promise<NatsSessionMetadata[]> {
    const store = await this.store();
    const out: NatsSessionMetadata[] = [];
    let offset: number | undefined;
    do {
      const reply: ListReply = await store.call<ListReply>("list", {
        ...(options?.cwd !== undefined ? { cwd: options.cwd } : {}),
        ...(offset !== undefined ? { offset } : {}),
      });
      for (const meta of reply.sessions) out.push(this.metadata(meta));
      offset = reply.next;
    } while (offset !== undefined);
    return out;
  }

  async delete(metadata: NatsSessionMetadata): Promise<void> {
    const store = await this.store();
    await store.call("delete", { id: metadata.id });
  }

  /**
   * fork copies entries of source into a new conversation, as Pi's JsonlSessionRepo.fork
   * does: all of them, the path to `entryId` (`position: "at"`), or the path before a user
   * message (`"before"`, the default). The copy happens inside the store, byte for byte.
   */
  async fork(
    source: NatsSessionMetadata,
    options: SessionForkOptions & NatsSessionCreateOptions,
  ): Promise<Session<NatsSessionMetadata>> {
    const store = await this.store();
    const id = options.id ?? createSessionId();
    const line = headerLine(id, {
      cwd: options.cwd,
      parentSessionPath: options.parentSessionPath ?? source.path,
      metadata: options.metadata ?? source.metadata,
    });
    const request: Record<string, unknown> = { source: source.id, line };
    if (options.entryId !== undefined) {
      request.entryId = options.entryId;
      request.position = options.position ?? "before";
    }
    // The store answers ok only once the fork holds every entry it copies, the same
    // request again included (after a lost reply it completes or finds the fork made).
    // A conflict is another conversation under that id: it is never taken for this fork.
    await store.call<CreateReply>("fork", request);
    // The fork's entries are read back: the index must hold exactly what the store holds.
    return this.open(this.metadata({ id, createdAt: "", cwd: options.cwd, path: "" }));
  }

  private session(store: StoreClient, wire: WireMeta, entries: SessionTreeEntry[], head: string | null): Session<NatsSessionMetadata> {
    return new Session(new NatsSessionStorage(store, this.metadata(wire), entries, head));
  }

  private metadata(wire: WireMeta): NatsSessionMetadata {
    const root = this.options.sessionsRoot;
    const path = root !== undefined && wire.path && !isAbsolute(wire.path) ? join(root, wire.path) : wire.path;
    const meta: NatsSessionMetadata = { id: wire.id, createdAt: wire.createdAt, cwd: wire.cwd, path };
    if (wire.parentSessionPath !== undefined) meta.parentSessionPath = wire.parentSessionPath;
    if (wire.metadata !== undefined) meta.metadata = wire.metadata;
    return meta;
  }
}

/**
 * headerLine is the header Pi's JsonlSessionStorage.create writes, key for key, so that the
 * store holds (and `pisync recover` writes) the line Pi's JSONL backend would.
 */
export function headerLine(id: string, options: Omit<NatsSessionCreateOptions, "id">, timestamp = new Date().toISOString()): string {
  return JSON.stringify({
    type: "session",
    version: 3,
    id,
    timestamp,
    cwd: options.cwd,
    parentSession: options.parentSessionPath,
    metadata: options.metadata,
  });
}
