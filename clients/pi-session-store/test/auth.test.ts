// NatsSessionRepo under the NATS permissions of docs/store-protocol.md: an owner's user
// may request only its own pisync.store.<tenant>.<owner>.> and receive replies only on its
// own inbox prefix. Against the real nats-server and `pisync serve` (harness.ts).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { NatsSessionRepo } from "../src/index.js";
import { Store } from "./harness.js";

let store: Store;
const repos: NatsSessionRepo[] = [];

function repo(options: { owner: string; user: string; inboxPrefix?: string }): NatsSessionRepo {
  const r = new NatsSessionRepo({
    servers: store.url, tenant: "t1", owner: options.owner, user: options.user, pass: `${options.user}-secret`,
    inboxPrefix: options.inboxPrefix, timeoutMs: 1500, attempts: 1,
  });
  repos.push(r);
  return r;
}

before(async () => {
  store = await Store.start({ auth: { owners: ["alice", "bob"] } });
});

after(async () => {
  for (const r of repos) await r.close().catch(() => undefined);
  await store?.stop();
});

const message = { role: "user", content: [{ type: "text", text: "hi" }], timestamp: 1 } as never;

test("an owner's user with its inbox prefix creates, appends, lists and opens its sessions", async () => {
  const alice = repo({ owner: "alice", user: "alice", inboxPrefix: "_INBOX.t1.alice" });
  const s = await alice.create({ cwd: "/home/alice" });
  const id = await s.appendMessage(message);
  assert.deepEqual((await alice.list()).map((m) => m.id), [(await s.getMetadata()).id]);
  assert.equal((await (await alice.open(await s.getMetadata())).getLeafId()), id);
});

test("an owner's user cannot reach another owner's subjects", async () => {
  const mallory = repo({ owner: "bob", user: "alice", inboxPrefix: "_INBOX.t1.alice" });
  await assert.rejects(mallory.list());
  const bob = repo({ owner: "bob", user: "bob", inboxPrefix: "_INBOX.t1.bob" });
  assert.deepEqual(await bob.list(), []);
});

test("without its inbox prefix an owner's user gets no replies", async () => {
  const alice = repo({ owner: "alice", user: "alice" });
  await assert.rejects(alice.list());
});
