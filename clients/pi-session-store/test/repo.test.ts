// Tests of NatsSessionRepo and NatsSessionStorage against the real `pisync serve` (see
// harness.ts). Equality with Pi's JSONL backend over a long scripted history is the Go
// conformance suite's job (conformance/store_test.go); these pin the client's own rules.

import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";
import { JsonlSessionRepo, type Session } from "@earendil-works/pi-agent-core";
import { NodeExecutionEnv } from "@earendil-works/pi-agent-core/node";
import { TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import {
  NatsSessionRepo,
  NatsSessionStorage,
  StoreClient,
  StoreConflictError,
  StoreError,
  encodeToken,
  type NatsSessionMetadata,
} from "../src/index.js";
import { Store } from "./harness.js";

function user(text: string, extra: object[] = []) {
  return { role: "user" as const, content: [{ type: "text" as const, text }, ...extra], timestamp: Date.now() } as never;
}

// dropFirstReply is nc whose first request to a subject ending in suffix is served, and
// its reply then dropped: the caller sees a timeout, as when a reply is lost.
function dropFirstReply(nc: NatsConnection, suffix: string): NatsConnection {
  let dropped = 0;
  return new Proxy(nc, {
    get(target, prop, receiver) {
      if (prop === "dropped") return dropped;
      if (prop !== "request") return Reflect.get(target, prop, receiver);
      return async (subj: string, payload: string, opts: object) => {
        const msg = await target.request(subj, payload, opts as never);
        if (subj.endsWith(suffix) && dropped === 0) {
          dropped++;
          throw new TimeoutError();
        }
        return msg;
      };
    },
  }) as NatsConnection;
}

let store: Store;
const repos: NatsSessionRepo[] = [];

// repo is a repository of a fresh owner (tests do not see each other's sessions).
function repo(owner = `owner-${randomUUID().slice(0, 8)}`, extra: object = {}): NatsSessionRepo {
  const r = new NatsSessionRepo({ servers: store.url, tenant: "t1", owner, timeoutMs: 3000, ...extra });
  repos.push(r);
  return r;
}

before(async () => {
  store = await Store.start();
});

after(async () => {
  for (const r of repos) await r.close();
  await store?.stop();
});

describe("encodeToken", () => {
  test("keeps [A-Za-z0-9-] and escapes every other byte", () => {
    for (const [name, want] of [
      ["alice", "alice"],
      ["a.b", "a_2Eb"],
      ["bob_x", "bob_5Fx"],
      ["é", "_C3_A9"],
      ["a b*>", "a_20b_2A_3E"],
    ]) {
      assert.equal(encodeToken(name), want, name);
    }
  });
});

describe("NatsSessionRepo", () => {
  test("create, append and reopen give the same entries, leaf, labels and context", async () => {
    const r = repo();
    const s = await r.create({ cwd: "/home/dev/a", metadata: { app: "test" } });
    await s.appendModelChange("anthropic", "claude-sonnet-4-5");
    const u1 = await s.appendMessage(user("first"));
    await s.appendLabel(u1, "start");
    await s.appendSessionName("named");
    await s.moveTo(null);
    await s.appendMessage(user("second root"));
    await s.moveTo(u1, { summary: "went back" });
    const reopened = await r.open(await s.getMetadata());
    assert.deepEqual(await reopened.getEntries(), JSON.parse(JSON.stringify(await s.getEntries())));
    assert.equal(await reopened.getLeafId(), await s.getLeafId());
    assert.equal(await reopened.getLabel(u1), "start");
    assert.equal(await reopened.getSessionName(), "named");
    assert.deepEqual(await reopened.buildContext(), await s.buildContext());
    const meta = await reopened.getMetadata();
    assert.equal(meta.cwd, "/home/dev/a");
    assert.deepEqual(meta.metadata, { app: "test" });
    assert.match(meta.path, /^--home-dev-a--\/.*_[0-9a-f-]+\.jsonl$/);
  });

  test("an entry above max_payload (a 1.5 MiB image) goes through in parts and reads back byte for byte", async () => {
    const r = repo();
    const s = await r.create({ cwd: "/home/dev/img" });
    const data = randomBytes(1100 * 1024).toString("base64");
    const id = await s.appendMessage(user("look", [{ type: "image", mimeType: "image/png", data }]));
    await s.appendMessage(user("after the image"));
    const reopened = await r.open(await s.getMetadata());
    const entry = (await reopened.getEntry(id)) as { message: { content: Array<{ data?: string }> } };
    assert.equal(entry.message.content[1]?.data, data);
    assert.equal((await reopened.getEntries()).length, 2);
  });

  test("open reads a session of several reply pages, and list pages past 500 sessions", async () => {
    const r = repo();
    const s = await r.create({ cwd: "/home/dev/pages" });
    const ids: string[] = [];
    // Entries of uneven sizes: pages end where open's guesses do not expect them.
    for (let i = 0; i < 1500; i++) ids.push(await s.appendMessage(user(`entry ${i} `.padEnd(i < 600 ? 600 : 3000, "p"))));
    const reopened = await r.open(await s.getMetadata());
    assert.deepEqual((await reopened.getEntries()).map((e) => e.id), ids); // about 3 MB: a long first page, shorter ones after
    assert.equal(await reopened.getLeafId(), ids[ids.length - 1]);

    const created = [(await s.getMetadata()).id];
    for (let i = 0; i < 500; i++) created.push((await (await r.create({ cwd: "/home/dev/many" })).getMetadata()).id);
    const listed = await r.list();
    assert.equal(listed.length, 501);
    assert.deepEqual(new Set(listed.map((m) => m.id)), new Set(created));
  });

  test("list, fork at and before an entry, and delete", async () => {
    const r = repo();
    const s = await r.create({ cwd: "/home/dev/f" });
    const u1 = await s.appendMessage(user("one"));
    const u2 = await s.appendMessage(user("two"));
    await s.appendMessage(user("three"));
    const meta = await s.getMetadata();
    const at = await r.fork(meta, { cwd: "/home/dev/g", entryId: u2, position: "at" });
    assert.deepEqual((await at.getEntries()).map((e) => e.id), [u1, u2]);
    assert.equal((await at.getMetadata()).parentSessionPath, meta.path);
    const beforeU2 = await r.fork(meta, { cwd: "/home/dev/f", entryId: u2 });
    assert.deepEqual((await beforeU2.getEntries()).map((e) => e.id), [u1]);
    const all = await r.fork(meta, { cwd: "/home/dev/f" });
    assert.equal((await all.getEntries()).length, 3);
    await all.appendMessage(user("four, in the fork"));

    assert.deepEqual(new Set((await r.list()).map((m) => m.id)), new Set([meta.id, (await at.getMetadata()).id, (await beforeU2.getMetadata()).id, (await all.getMetadata()).id]));
    assert.deepEqual((await r.list({ cwd: "/home/dev/g" })).map((m) => m.id), [(await at.getMetadata()).id]);

    await r.delete(await all.getMetadata());
    await assert.rejects(r.open(await all.getMetadata()), (err: StoreError) => err.storeCode === "not_found" && err.code === "not_found");
    assert.equal((await r.list()).length, 3);
  });

  test("tenant and owner names outside [A-Za-z0-9-] reach the service, encoded as the Go side encodes them", async () => {
    const r = new NatsSessionRepo({ servers: store.url, tenant: "t.1", owner: `bob_x é ${randomUUID().slice(0, 4)}`, timeoutMs: 3000 });
    repos.push(r);
    const s = await r.create({ cwd: "/home/dev/enc" });
    await s.appendMessage(user("encoded"));
    assert.deepEqual((await r.list()).map((m) => m.id), [(await s.getMetadata()).id]);
    assert.equal((await (await r.open(await s.getMetadata())).getEntries()).length, 1);
  });

  test("another owner's session is not_found", async () => {
    const alice = repo();
    const s = await alice.create({ cwd: "/home/dev/x" });
    await s.appendMessage(user("private"));
    const mallory = repo();
    await assert.rejects(mallory.open(await s.getMetadata()), (err: StoreError) => err.storeCode === "not_found");
    await assert.rejects(mallory.delete(await s.getMetadata()), (err: StoreError) => err.storeCode === "not_found");
    assert.deepEqual(await mallory.list(), []);
  });

  test("sessionsRoot makes paths those of Pi's JSONL repo on that root", async () => {
    const root = mkdtempSync(join(tmpdir(), "pss-root-"));
    try {
      const r = repo(undefined, { sessionsRoot: root });
      const s = await r.create({ cwd: "/home/dev/rooted" });
      assert.ok((await s.getMetadata()).path.startsWith(join(root, "--home-dev-rooted--") + "/"));
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });

  test("create sends the header line Pi's JSONL storage writes", async () => {
    const root = mkdtempSync(join(tmpdir(), "pss-header-"));
    try {
      const jsonl = new JsonlSessionRepo({ fs: new NodeExecutionEnv({ cwd: root }), sessionsRoot: root });
      const js = await jsonl.create({ cwd: "/home/dev/h", parentSessionPath: "/p/x.jsonl", metadata: { k: [1, "é"] } });
      const want = readFileSync((await js.getMetadata()).path, "utf8").trimEnd();
      const header = JSON.parse(want) as { id: string; timestamp: string };
      const { headerLine } = await import("../src/repo.js");
      const RealDate = Date;
      globalThis.Date = class extends RealDate {
        constructor() {
          super(header.timestamp);
        }
      } as DateConstructor;
      try {
        assert.equal(headerLine(header.id, { cwd: "/home/dev/h", parentSessionPath: "/p/x.jsonl", metadata: { k: [1, "é"] } }), want);
      } finally {
        globalThis.Date = RealDate;
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe("NatsSessionStorage", () => {
  // twoRuntimes opens one session in two repositories (two connections).
  async function twoRuntimes(): Promise<{ a: Session<NatsSessionMetadata>; b: Session<NatsSessionMetadata>; root: string; ra: NatsSessionRepo; rb: NatsSessionRepo }> {
    const owner = `owner-${randomUUID().slice(0, 8)}`;
    const ra = repo(owner);
    const rb = repo(owner);
    const s = await ra.create({ cwd: "/home/dev/race" });
    const root = await s.appendMessage(user("root"));
    const meta = await s.getMetadata();
    return { a: await ra.open(meta), b: await rb.open(meta), root, ra, rb };
  }

  test("two runtimes append on one head: one succeeds, the other gets conflict with the head, and its index does not move", async () => {
    const { a, b, root } = await twoRuntimes();
    const results = await Promise.allSettled([a.appendMessage(user("from a")), b.appendMessage(user("from b"))]);
    const won = results.filter((r) => r.status === "fulfilled");
    const lost = results.filter((r): r is PromiseRejectedResult => r.status === "rejected");
    assert.equal(won.length, 1, JSON.stringify(results));
    assert.equal(lost.length, 1);
    const err = lost[0]!.reason as StoreConflictError;
    assert.ok(err instanceof StoreConflictError, String(err));
    assert.equal(err.head, (won[0] as PromiseFulfilledResult<string>).value);
    const loser = results[0]!.status === "rejected" ? a : b;
    assert.equal(await loser.getLeafId(), root);
    assert.equal((await loser.getEntries()).length, 1);
  });

  test("after a conflict the stale view refuses to append; reopened, it continues from the head", async () => {
    const { a, b, ra } = await twoRuntimes();
    const winner = await a.appendMessage(user("from a"));
    await assert.rejects(b.appendMessage(user("from b")), StoreConflictError);
    await assert.rejects(b.appendMessage(user("from b, again")), StoreConflictError);
    const fresh = await ra.open(await b.getMetadata());
    assert.equal(await fresh.getLeafId(), winner);
    const next = await fresh.appendMessage(user("from b, on the head"));
    assert.equal((await fresh.getEntry(next))?.parentId, winner);
  });

  test("open refuses to append when the entries' leaf is not the store's head", async () => {
    const { a } = await twoRuntimes();
    const meta = await a.getMetadata();
    const entries = await a.getEntries();
    let sent = 0;
    const appender = { append: async () => (sent++, null) };
    const storage = new NatsSessionStorage(appender, meta, entries, "someone-elses-head");
    await assert.rejects(storage.appendEntry({ type: "custom", id: "c0ffee00", parentId: entries[0]!.id, timestamp: new Date().toISOString(), customType: "x" }), StoreConflictError);
    assert.equal(sent, 0);
    assert.equal((await storage.getEntries()).length, 1);
  });

  test("a retried fork whose reply was lost gives the fork made", async () => {
    const nc = await store.connect();
    try {
      const owner = `owner-${randomUUID().slice(0, 8)}`;
      const r = repo(owner, { connection: dropFirstReply(nc, ".fork"), servers: undefined });
      const s = await r.create({ cwd: "/home/dev/fork-retry" });
      const u1 = await s.appendMessage(user("one"));
      await s.appendMessage(user("two"));
      const fork = await r.fork(await s.getMetadata(), { cwd: "/home/dev/fork-retry", entryId: u1, position: "at" });
      assert.deepEqual((await fork.getEntries()).map((e) => e.id), [u1]);
      assert.equal((await r.list()).length, 2);
      // Someone else's fork under that id is still a conflict.
      const other = await r.create({ cwd: "/home/dev/other" });
      await assert.rejects(
        r.fork(await s.getMetadata(), { cwd: "/home/dev/elsewhere", id: (await other.getMetadata()).id }),
        StoreConflictError,
      );
    } finally {
      await nc.close();
    }
  });

  test("a retried append whose reply was lost is stored once", async () => {
    const nc = await store.connect();
    try {
      // The first append is served, then its reply is dropped: the client sees a timeout
      // and sends the same request again.
      const lossy = dropFirstReply(nc, ".append");
      const owner = `owner-${randomUUID().slice(0, 8)}`;
      const r = repo(owner, { connection: lossy, servers: undefined });
      const s = await r.create({ cwd: "/home/dev/retry" });
      const id = await s.appendMessage(user("sent twice, stored once"));
      assert.equal((lossy as unknown as { dropped: number }).dropped, 1);
      const reopened = await r.open(await s.getMetadata());
      assert.deepEqual((await reopened.getEntries()).map((e) => e.id), [id]);
      // The same bytes again are a duplicate, other bytes under that id a conflict.
      const client = new StoreClient(nc, "t1", owner);
      const line = JSON.stringify(await reopened.getEntry(id));
      assert.equal(await client.append((await s.getMetadata()).id, id, line, null), id);
      await assert.rejects(client.append((await s.getMetadata()).id, id, line.replace("once", "twice"), null), StoreConflictError);
    } finally {
      await nc.close();
    }
  });
});

describe("fork across a replica killed mid-copy", () => {
  test("the fork the client returns is complete: the retry resumes the copy the killed replica left", async () => {
    const r = repo();
    const s = await r.create({ cwd: "/home/dev/kill-fork" });
    const ids: string[] = [];
    for (let i = 0; i < 2500; i++) ids.push(await s.appendMessage(user(`entry ${i}`)));
    const meta = await s.getMetadata();
    // How long a whole fork takes here: the replicas are killed halfway through the next.
    const t0 = Date.now();
    await r.fork(meta, { cwd: "/home/dev/kill-fork" });
    const half = Math.max(1, (Date.now() - t0) / 2);
    const forking = r.fork(meta, { cwd: "/home/dev/kill-fork" });
    await sleep(half);
    for (const p of store.serveProcesses) await p.kill("SIGKILL");
    await store.startServe();
    const fork = await forking;
    assert.deepEqual((await fork.getEntries()).map((e) => e.id), ids);
    const forkId = (await fork.getMetadata()).id;
    const listed = (await r.list()).find((m) => m.id === forkId);
    assert.ok(listed, "the completed fork is listed");
  });
});

describe("a server with a small max_payload", () => {
  let small: Store;
  before(async () => {
    small = await Store.start({ maxPayload: 256 * 1024 });
  });
  after(async () => {
    await small?.stop();
  });

  test("entries above it, and below the 512 KiB of a default part, are appended and read back", async () => {
    const r = new NatsSessionRepo({ servers: small.url, tenant: "t1", owner: `owner-${randomUUID().slice(0, 8)}`, timeoutMs: 3000 });
    repos.push(r);
    const s = await r.create({ cwd: "/home/dev/small" });
    const texts = ["x".repeat(200 * 1024), "y".repeat(300 * 1024), "z".repeat(700 * 1024)];
    const ids: string[] = [];
    for (const t of texts) ids.push(await s.appendMessage(user(t)));
    const reopened = await r.open(await s.getMetadata());
    assert.deepEqual(await reopened.getEntries(), JSON.parse(JSON.stringify(await s.getEntries())));
    assert.deepEqual((await reopened.getEntries()).map((e) => e.id), ids);
  });
});
