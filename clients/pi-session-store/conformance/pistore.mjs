#!/usr/bin/env node
// pistore drives Pi's own Session (pi-agent-core) on two backends — Pi's JsonlSessionRepo
// and this package's NatsSessionRepo — so that pisync's Go conformance tests
// (conformance/store*_test.go) can check that the store is, for Pi, the same storage.
//
// Output: JSON on stdout; errors on stderr with a non-zero exit code.
//
// Same ids and same clock on both backends: each run installs a clock that moves only when
// the script says so (tick), and gives entry ids from a counter (createEntryId, and the
// id of `leaf` records, which Pi's JSONL storage draws itself). Random payloads come from a
// seeded generator. Two runs of `history` therefore write the same entries, whatever the
// backend.

import { mkdir, writeFile } from "node:fs/promises";
import { relative, resolve } from "node:path";
import { parseArgs } from "node:util";
import { JsonlSessionRepo, JsonlSessionStorage, Session } from "@earendil-works/pi-agent-core";
import { NodeExecutionEnv } from "@earendil-works/pi-agent-core/node";
import { NatsSessionRepo, StoreConflictError } from "../dist/index.js";

// ---------------------------------------------------------------------------
// Clock and ids

const RealDate = Date;
let now = RealDate.parse("2026-11-30T09:00:00.000Z");
/** tick moves the fake clock on by ms (default 1 s): every timestamp after it is new. */
function tick(ms = 1000) {
  now += ms;
}
class FakeDate extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(now);
    else super(...args);
  }
  static now() {
    return now;
  }
}
globalThis.Date = FakeDate;

let nextId = 0xa0000000;
function entryId() {
  nextId += 1;
  return nextId.toString(16);
}

// deterministic puts the counter ids into a session's storage. Pi's JSONL storage draws the
// id of a `leaf` record itself; its setLeafId is replaced by the same steps with the
// counter id (the same entry, written with appendEntry, which moves the leaf to targetId).
function deterministic(session) {
  const storage = session.getStorage();
  storage.createEntryId = async () => entryId();
  if (storage instanceof JsonlSessionStorage) {
    storage.setLeafId = async function (leafId) {
      if (leafId !== null && !(await this.getEntry(leafId))) throw new Error(`Entry ${leafId} not found`);
      await this.appendEntry({ type: "leaf", id: entryId(), parentId: await this.getLeafId(), timestamp: new Date().toISOString(), targetId: leafId });
    };
  }
  return session;
}

// A seeded xorshift: payloads that look random (incompressible) and are the same each run.
let seed = 0x9e3779b9;
function randomBytes(n) {
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i++) {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    out[i] = seed & 0xff;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Payloads (shaped like pi-ai messages, as in conformance/pihelper)

function usage(input = 120, output = 40) {
  return { input, output, cacheRead: 10, cacheWrite: 5, totalTokens: input + output + 15, cost: { input: 0.0003, output: 0.0006, cacheRead: 0, cacheWrite: 0, total: 0.0009 } };
}
function user(text, extra = []) {
  return { role: "user", content: [{ type: "text", text }, ...extra], timestamp: Date.now() };
}
function assistant(content, { provider = "anthropic", model = "claude-sonnet-4-5" } = {}) {
  const blocks = typeof content === "string" ? [{ type: "text", text: content }] : content;
  return {
    role: "assistant", content: blocks, api: provider === "openai" ? "openai-responses" : "anthropic-messages", provider, model,
    usage: usage(), stopReason: blocks.some((b) => b.type === "toolCall") ? "toolUse" : "stop", timestamp: Date.now(),
  };
}
function toolCall(id, name, args) {
  return { type: "toolCall", id, name, arguments: args };
}
function toolResult(toolCallId, toolName, text) {
  return { role: "toolResult", toolCallId, toolName, content: [{ type: "text", text }], isError: false, timestamp: Date.now() };
}
function image(bytes) {
  return { type: "image", mimeType: "image/png", data: randomBytes(bytes).toString("base64") };
}

// ---------------------------------------------------------------------------
// Backends

const env = new NodeExecutionEnv({ cwd: process.cwd() });

function jsonlRepo(root) {
  return new JsonlSessionRepo({ fs: env, sessionsRoot: root });
}

function natsRepo(flags) {
  return new NatsSessionRepo({
    servers: flags.servers, tenant: flags.tenant, owner: flags.owner, prefix: flags.prefix,
    sessionsRoot: flags.root, timeoutMs: flags.timeoutMs, attempts: flags.attempts || undefined,
  });
}

// ---------------------------------------------------------------------------
// The scripted history

// IDs of the sessions, fixed so that both backends create the same conversations.
const IDS = {
  main: "019ad000-0000-7000-8000-000000000001",
  forkAt: "019ad000-0000-7000-8000-000000000002",
  forkBefore: "019ad000-0000-7000-8000-000000000003",
  forkAll: "019ad000-0000-7000-8000-000000000004",
  deleted: "019ad000-0000-7000-8000-000000000005",
  plain: "019ad000-0000-7000-8000-000000000006",
};

async function history(repo) {
  const s = {};
  tick();
  const main = deterministic(await repo.create({ id: IDS.main, cwd: "/home/dev/store", metadata: { app: "pisync-conformance", tenant: "t1" } }));
  const step = async (fn) => {
    tick();
    return fn();
  };
  await step(() => main.appendModelChange("anthropic", "claude-sonnet-4-5"));
  await step(() => main.appendThinkingLevelChange("medium"));
  await step(() => main.appendActiveToolsChange(["read", "bash", "edit"]));
  const u1 = await step(() => main.appendMessage(user("List the files, then read README.md.")));
  await step(() => main.appendMessage(assistant([{ type: "text", text: "Let me look." }, toolCall("call_1", "bash", { command: "ls" })])));
  await step(() => main.appendMessage(toolResult("call_1", "bash", "README.md\nmain.go\n")));
  const a1 = await step(() => main.appendMessage(assistant("There is a README and a main.go.")));
  await step(() => main.appendSessionName("Store conformance"));
  await step(() => main.appendLabel(u1, "start"));
  await step(() => main.appendLabel(a1, "temporary"));
  await step(() => main.appendLabel(a1, undefined));
  await step(() => main.appendCustomEntry("pisync-test/state", { owner: "alice", counter: 1 }));
  await step(() => main.appendCustomMessageEntry("pisync-test/notice", "The build is green.", true, { source: "ci" }));
  // An image above 1 MiB: its line is above NATS's max_payload.
  const u2 = await step(() => main.appendMessage(user("What is in this screenshot?", [image(1200 * 1024)])));
  const a2 = await step(() => main.appendMessage(assistant("A terminal with a green build.")));
  await step(() => main.appendModelChange("openai", "gpt-5"));
  await step(() => main.appendThinkingLevelChange("high"));
  // Branching: back to u1 (a `leaf` record), another answer, then back to a2 with a summary.
  await step(() => main.moveTo(u1));
  const b1 = await step(() => main.appendMessage(assistant("Alternative: the directory is empty.", { provider: "openai", model: "gpt-5" })));
  await step(() => main.moveTo(a2, { summary: "Tried an answer claiming an empty directory.", details: { readFiles: [], modifiedFiles: [] }, usage: usage(50, 20) }));
  const u3 = await step(() => main.appendMessage(user("Step 3: add a health endpoint.")));
  await step(() => main.appendMessage(assistant("Added GET /healthz.", { provider: "openai", model: "gpt-5" })));
  await step(() => main.appendCompaction("Read the tree, looked at a screenshot, added /healthz.", u3, 18000, { readFiles: ["README.md"] }, false, usage(18000, 300)));
  const u4 = await step(() => main.appendMessage(user("Step 4: graceful shutdown.")));
  const a4 = await step(() => main.appendMessage(assistant("Added signal handling.", { provider: "openai", model: "gpt-5" })));
  await step(() => main.appendCompaction("Health endpoint and graceful shutdown exist.", undefined, 24000, undefined, true, usage(24000, 200), [user("Step 4: graceful shutdown."), assistant("Added signal handling.")]));
  const u5 = await step(() => main.appendMessage(user("Step 5: metrics.")));
  await step(() => main.appendMessage(assistant("Added /metrics.", { provider: "openai", model: "gpt-5" })));
  await step(() => main.moveTo(null));
  await step(() => main.appendMessage(user("Unrelated: what is a goroutine?")));
  await step(() => main.moveTo(b1));
  s.main = main;
  const mainMeta = await main.getMetadata();

  tick();
  s.forkAt = deterministic(await repo.fork(mainMeta, { id: IDS.forkAt, cwd: "/home/dev/fork", entryId: a4, position: "at" }));
  await step(() => s.forkAt.appendMessage(user("Continuing the fork at a4.")));
  tick();
  s.forkBefore = deterministic(await repo.fork(mainMeta, { id: IDS.forkBefore, cwd: "/home/dev/store", entryId: u5, position: "before" }));
  tick();
  s.forkAll = deterministic(await repo.fork(mainMeta, { id: IDS.forkAll, cwd: "/home/dev/store" }));
  await step(() => s.forkAll.appendMessage(user("Continuing the whole-session fork.")));

  tick();
  const plain = deterministic(await repo.create({ id: IDS.plain, cwd: "/home/dev/plain" }));
  await step(() => plain.appendMessage(user("Hello.")));
  s.plain = plain;
  tick();
  const doomed = deterministic(await repo.create({ id: IDS.deleted, cwd: "/home/dev/store" }));
  await step(() => doomed.appendMessage(user("This session will be deleted.")));
  await repo.delete(await doomed.getMetadata());
  let reopenDeleted;
  try {
    await repo.open(await doomed.getMetadata());
    reopenDeleted = "opened";
  } catch (err) {
    reopenDeleted = err?.code ?? String(err);
  }

  // Every session is read back through a fresh open, as another process would see it.
  const reopened = {};
  for (const [name, session] of Object.entries(s)) reopened[name] = await repo.open(await session.getMetadata());
  return { live: s, reopened, reopenDeleted, unused: { u2 } };
}

// ---------------------------------------------------------------------------
// The dump: every read of SessionStorage, plus Pi's context

const TYPES = ["message", "thinking_level_change", "model_change", "active_tools_change", "compaction", "branch_summary", "custom", "custom_message", "label", "session_info", "leaf"];

// attempt is fn's value, or Pi's error (code and message) when it throws: both backends
// must fail alike, e.g. on the path of a fork cut behind a compaction.
async function attempt(fn) {
  try {
    return await fn();
  } catch (err) {
    return { error: `${err?.code ?? "?"}: ${err?.message ?? err}` };
  }
}

async function dumpSession(session, root) {
  const storage = session.getStorage();
  const meta = await storage.getMetadata();
  const entries = await storage.getEntries();
  const leafId = await storage.getLeafId();
  const paths = {};
  const labels = {};
  const byId = {}; // getEntry of every id: the entry itself (true), or what it gave instead
  for (const e of entries) {
    const got = await storage.getEntry(e.id);
    byId[e.id] = JSON.stringify(got) === JSON.stringify(e) || (got ?? null);
    if (e.type !== "leaf") paths[e.id] = await attempt(async () => (await storage.getPathToRootOrCompaction(e.id)).map((x) => x.id));
    const label = await storage.getLabel(e.id);
    if (label !== undefined) labels[e.id] = label;
  }
  const found = {};
  for (const type of TYPES) found[type] = await storage.findEntries(type);
  return {
    meta: { ...meta, path: meta.path && root ? relative(root, meta.path) : meta.path },
    entries,
    page: await storage.getEntries({ afterEntrySeq: 2, limit: 3 }),
    leafId,
    pathToLeaf: await attempt(() => storage.getPathToRootOrCompaction(leafId)),
    paths,
    byId,
    labels,
    sessionName: (await storage.getSessionName()) ?? null,
    stats: await storage.getSessionStats(),
    found,
    branch: await attempt(async () => (await session.getBranch()).map((e) => e.id)),
    context: await attempt(() => session.buildContext()),
  };
}

async function runHistory(flags) {
  const root = resolve(flags.root);
  await mkdir(root, { recursive: true });
  const repo = flags.backend === "jsonl" ? jsonlRepo(root) : natsRepo({ ...flags, root });
  try {
    const { live, reopened, reopenDeleted } = await history(repo);
    const out = { sessions: {}, reopened: {}, reopenDeleted, list: [], files: {} };
    for (const [name, session] of Object.entries(live)) {
      out.sessions[name] = await dumpSession(session, root);
      out.files[name] = { id: (await session.getMetadata()).id, path: relative(root, (await session.getMetadata()).path) };
    }
    for (const [name, session] of Object.entries(reopened)) out.reopened[name] = await dumpSession(session, root);
    out.list = (await repo.list()).map((m) => ({ ...m, path: relative(root, m.path) }));
    return out;
  } finally {
    await repo.close?.();
  }
}

// open-nats: open one conversation through the store, dump it, append `--append` messages
// (continuing it), and dump it again.
async function openNats(flags) {
  const repo = natsRepo(flags);
  try {
    const list = await repo.list();
    const meta = list.find((m) => m.id === flags.id);
    if (!meta) throw new Error(`list has no session ${flags.id}: ${JSON.stringify(list.map((m) => m.id))}`);
    const session = await repo.open(meta);
    const before = await dumpSession(session, undefined);
    const appended = [];
    for (let i = 0; i < flags.append; i++) {
      tick();
      appended.push(await session.appendMessage(i % 2 === 0 ? user(`continued through the store ${i}`) : assistant(`reply through the store ${i}`)));
    }
    const after = await dumpSession(await repo.open(meta), undefined);
    return { meta, before, appended, after };
  } finally {
    await repo.close();
  }
}

// dump-jsonl: the same dump of a local file, read by Pi's JSONL storage.
async function dumpJsonl(flags) {
  const session = new Session(await JsonlSessionStorage.open(env, resolve(flags.path)));
  return dumpSession(session, undefined);
}

// race: two runtimes open one session and each appends on the same head, at once; then a
// retried append whose first reply was lost (the request is served, the reply dropped).
async function race(flags) {
  const a = natsRepo(flags);
  const b = natsRepo(flags);
  try {
    tick();
    const created = deterministic(await a.create({ id: flags.id, cwd: "/home/dev/race" }));
    tick();
    const root = await created.appendMessage(user("Who wins?"));
    const meta = await created.getMetadata();
    const sa = deterministic(await a.open(meta));
    const sb = deterministic(await b.open(meta));
    tick();
    const results = await Promise.allSettled([sa.appendMessage(assistant("A answers.")), sb.appendMessage(assistant("B answers."))]);
    const outcome = [];
    for (const [i, r] of results.entries()) {
      const s = i === 0 ? sa : sb;
      outcome.push({
        status: r.status,
        id: r.status === "fulfilled" ? r.value : undefined,
        conflict: r.status === "rejected" && r.reason instanceof StoreConflictError,
        head: r.status === "rejected" ? r.reason.head ?? null : undefined,
        storeCode: r.status === "rejected" ? r.reason.storeCode : undefined,
        localLeaf: await s.getLeafId(),
        localEntries: (await s.getEntries()).length,
      });
    }
    // The loser may not append again on its stale view; reopened, it continues from head.
    const loser = results[0].status === "rejected" ? sa : sb;
    let retryStale;
    try {
      tick();
      await loser.appendMessage(user("Again on the old view."));
      retryStale = "ok";
    } catch (err) {
      retryStale = err instanceof StoreConflictError ? "conflict" : String(err);
    }
    const fresh = deterministic(await (loser === sa ? a : b).open(meta));
    tick();
    const continued = await fresh.appendMessage(user("Continuing from the head."));
    const final = await a.open(meta);
    return { root, outcome, retryStale, continued, entries: (await final.getEntries()).map((e) => e.id), head: await final.getLeafId() };
  } finally {
    await a.close();
    await b.close();
  }
}

// appender: create session --id and append --count messages, one after the other, each
// acknowledged one printed as a line {"n":i,"id":...} at once (not the final JSON): the
// Go test kills and restarts serve meanwhile, and the client's retries carry the appends
// across. Ends with {"done":true,"entries":[ids read back through a fresh open]}.
async function appender(flags) {
  const repo = natsRepo(flags);
  try {
    const session = await repo.create({ id: flags.id, cwd: "/home/dev/appender" });
    for (let n = 1; n <= flags.count; n++) {
      const id = await session.appendMessage(n % 2 ? user(`message ${n}`) : assistant(`answer ${n}`));
      process.stdout.write(JSON.stringify({ n, id }) + "\n");
    }
    const reread = await repo.open(await session.getMetadata());
    return { done: true, entries: (await reread.getEntries()).map((e) => e.id), head: await reread.getLeafId() };
  } finally {
    await repo.close();
  }
}

// ---------------------------------------------------------------------------
// Command line

const OPTIONS = {
  backend: { type: "string" }, root: { type: "string" }, servers: { type: "string" }, prefix: { type: "string", default: "pisync" },
  tenant: { type: "string", default: "default" }, owner: { type: "string", default: "alice" }, id: { type: "string" },
  path: { type: "string" }, out: { type: "string" }, append: { type: "string", default: "0" }, timeoutMs: { type: "string", default: "5000" },
  count: { type: "string", default: "0" }, entries: { type: "string", default: "0" }, attempts: { type: "string", default: "0" },
};
const NUMBERS = ["append", "timeoutMs", "count", "entries", "attempts"];

function parseFlags(args) {
  const { values } = parseArgs({ args, options: OPTIONS, strict: true });
  for (const name of NUMBERS) values[name] = Number(values[name]);
  return values;
}

// Sorted keys (JSON.stringify drops undefined): equal reads print equal bytes.
function sortedKeys(_key, value) {
  if (!value || typeof value !== "object" || Array.isArray(value)) return value;
  return Object.fromEntries(Object.keys(value).sort().map((k) => [k, value[k]]));
}

const commands = {
  history: runHistory,
  "open-nats": openNats,
  "dump-jsonl": dumpJsonl,
  race,
  appender,
};

async function main() {
  const [command, ...rest] = process.argv.slice(2);
  const run = commands[command];
  if (!run) {
    process.stderr.write(`usage: pistore.mjs ${Object.keys(commands).join("|")} [--flags]\n`);
    process.exitCode = 2;
    return;
  }
  const flags = parseFlags(rest);
  const out = await run(flags);
  const text = JSON.stringify(out, sortedKeys) + "\n";
  if (flags.out) await writeFile(flags.out, text);
  else process.stdout.write(text);
}

main().catch((err) => {
  process.stderr.write(`pistore: ${err?.stack ?? err}\n`);
  process.exitCode = 1;
});
