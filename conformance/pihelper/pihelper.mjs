#!/usr/bin/env node
// pihelper drives Pi's own session code so that pisync's Go tests can check
// themselves against real Pi instead of against our reading of Pi's format.
// Every session line it produces is written by Pi (harness JsonlSessionRepo /
// Session, or the coding-agent SessionManager); the one exception is the legacy
// v1 file, which Pi no longer writes and which is therefore built by hand.
//
// Output: JSON on stdout; errors on stderr with a non-zero exit code
// (1: Pi or the file failed, 2: bad command line). See README.md.

import { randomBytes, randomUUID } from "node:crypto";
import { copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, relative, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { JsonlSessionRepo, JsonlSessionStorage, Session, createSessionId } from "@earendil-works/pi-agent-core";
import { NodeExecutionEnv } from "@earendil-works/pi-agent-core/node";

const env = new NodeExecutionEnv({ cwd: process.cwd() });

// The coding-agent's package entry imports node:fs globSync (Node >= 22) and its
// `exports` map hides dist/core, so we import the session manager module by URL.
// That module itself only needs Node 20. Loaded lazily: harness commands must
// keep working even if a future coding-agent release breaks this route.
//
// Loaders: "cli" is the current coding-agent; "cli-0.73" is
// @mariozechner/pi-coding-agent 0.73.1, the most-installed CLI release, so that
// files written and read by the Pi that most users run are checked too.
const CLI_PACKAGES = { cli: "@earendil-works/pi-coding-agent", "cli-0.73": "@mariozechner/pi-coding-agent" };
const LOADERS = ["harness", ...Object.keys(CLI_PACKAGES)];
const cliModules = {};
async function loadCli(loader = "cli") {
  cliModules[loader] ??= await import(new URL("./core/session-manager.js", import.meta.resolve(CLI_PACKAGES[loader])));
  return cliModules[loader];
}

function checkLoader(v) {
  if (!LOADERS.includes(v)) throw new UsageError(`--loader must be one of ${LOADERS.join(", ")}, got ${JSON.stringify(v)}`);
  return v;
}

class UsageError extends Error {}

// ---------------------------------------------------------------------------
// Message payloads. They are data, shaped like what Pi's providers and tools
// produce (pi-ai UserMessage / AssistantMessage / ToolResultMessage).

// Fixed decimal costs: computed ones (0.0006000000000000001) would make the
// Go side's JSON comparisons depend on float formatting.
function usage(input = 120, output = 40) {
  return {
    input, output, cacheRead: 0, cacheWrite: 0, totalTokens: input + output,
    cost: { input: 0.0003, output: 0.0006, cacheRead: 0, cacheWrite: 0, total: 0.0009 },
  };
}

function user(text, extra = []) {
  return { role: "user", content: [{ type: "text", text }, ...extra], timestamp: Date.now() };
}

function assistant(content, { provider = "anthropic", model = "claude-sonnet-4-5", stopReason } = {}) {
  const blocks = typeof content === "string" ? [{ type: "text", text: content }] : content;
  return {
    role: "assistant", content: blocks, api: provider === "openai" ? "openai-responses" : "anthropic-messages",
    provider, model, usage: usage(), stopReason: stopReason ?? (blocks.some((b) => b.type === "toolCall") ? "toolUse" : "stop"),
    timestamp: Date.now(),
  };
}

function toolCall(id, name, args) {
  return { type: "toolCall", id, name, arguments: args };
}

function toolResult(toolCallId, toolName, text, isError = false) {
  return { role: "toolResult", toolCallId, toolName, content: [{ type: "text", text }], isError, timestamp: Date.now() };
}

// Base64 of random bytes: incompressible, like a real screenshot.
function bigImage(base64Chars) {
  return { type: "image", mimeType: "image/png", data: randomBytes(Math.ceil((base64Chars * 3) / 4)).toString("base64").slice(0, base64Chars) };
}

// ---------------------------------------------------------------------------
// write-scenarios

async function harnessItem(name, session, sessionsRoot, extra = {}) {
  const meta = await session.getMetadata();
  return { name, api: "harness", format: "harness-v3", path: meta.path, sessionsRoot, conversationId: meta.id, ...extra };
}

function cliItem(name, path, sessionsRoot, conversationId, extra = {}) {
  return { name, api: "cli", format: "cli-v3", path, sessionsRoot, conversationId, ...extra };
}

async function writeScenarios(rootDir) {
  const root = resolve(rootDir);
  const harnessRoot = join(root, "harness");
  const repo = new JsonlSessionRepo({ fs: env, sessionsRoot: harnessRoot });
  const out = [];

  // Every entry type the harness writes except leaf/branch_summary, plus
  // tool calls, tool results, a bash execution and header metadata.
  const basic = await repo.create({ cwd: "/home/dev/alpha", metadata: { app: "pisync-conformance", tenant: "t1" } });
  await basic.appendModelChange("anthropic", "claude-sonnet-4-5");
  await basic.appendThinkingLevelChange("medium");
  await basic.appendActiveToolsChange(["read", "bash", "edit", "write"]);
  const bu1 = await basic.appendMessage(user("List the files, then read README.md."));
  await basic.appendMessage(assistant([{ type: "text", text: "Let me look." }, toolCall("call_1", "bash", { command: "ls" })]));
  await basic.appendMessage(toolResult("call_1", "bash", "README.md\nmain.go\n"));
  await basic.appendMessage(assistant([toolCall("call_2", "read", { path: "README.md" })]));
  await basic.appendMessage(toolResult("call_2", "read", "# Demo\nA demo project.\n"));
  const ba3 = await basic.appendMessage(assistant("The project has a README and a main.go."));
  await basic.appendSessionName("Explore the demo project");
  await basic.appendLabel(bu1, "start");
  await basic.appendLabel(ba3, "temporary");
  await basic.appendLabel(ba3, undefined); // clearing a label is an entry too
  await basic.appendCustomEntry("pisync-test/state", { owner: "alice", counter: 1 });
  await basic.appendCustomMessageEntry("pisync-test/notice", "The build is green.", true, { source: "ci" });
  await basic.appendMessage({ role: "bashExecution", command: "go test ./...", output: "ok  demo 0.01s\n", exitCode: 0, cancelled: false, truncated: false, timestamp: Date.now() });
  await basic.appendModelChange("openai", "gpt-5");
  await basic.appendThinkingLevelChange("high");
  await basic.appendActiveToolsChange(["read", "bash"]);
  await basic.appendMessage(user("Thanks, summarise in one line."));
  await basic.appendMessage(assistant("A tiny Go demo with a README.", { provider: "openai", model: "gpt-5" }));
  out.push(await harnessItem("harness-basic", basic, harnessRoot));

  // Navigation: moveTo without summary writes a `leaf` entry; with a summary it
  // writes `leaf` then `branch_summary`; moveTo(null) starts a second root; the
  // file ends on a `leaf` entry, so the last line's id is NOT the leaf.
  const br = await repo.create({ cwd: "/home/dev/alpha" });
  const u1 = await br.appendMessage(user("Write a function that adds two numbers."));
  const a1 = await br.appendMessage(assistant("func add(a, b int) int { return a + b }"));
  await br.appendMessage(user("Now make it generic."));
  const a2 = await br.appendMessage(assistant("func add[T ~int | ~float64](a, b T) T { return a + b }"));
  await br.moveTo(u1);
  await br.appendMessage(assistant("Here it is in Python: def add(a, b): return a + b"));
  await br.appendMessage(user("And with type hints?"));
  const a2b = await br.appendMessage(assistant("def add(a: int, b: int) -> int: return a + b"));
  await br.moveTo(a2, { summary: "Explored a Python variant with type hints; user went back to Go.", details: { readFiles: [], modifiedFiles: [] } });
  await br.appendMessage(user("Add a test for the generic version."));
  await br.appendMessage(assistant("func TestAdd(t *testing.T) { if add(1, 2) != 3 { t.Fatal() } }"));
  await br.moveTo(null);
  await br.appendMessage(user("Unrelated: what is a goroutine?"));
  await br.appendMessage(assistant("A lightweight thread managed by the Go runtime."));
  await br.moveTo(a2b);
  out.push(await harnessItem("harness-branching", br, harnessRoot, { expectedLeafId: a2b, firstMessageId: u1, firstReplyId: a1 }));

  // Compaction: one with firstKeptEntryId, a later one with retainedTail.
  const cp = await repo.create({ cwd: "/home/dev/beta" });
  await cp.appendModelChange("anthropic", "claude-sonnet-4-5");
  await cp.appendMessage(user("Step 1: scaffold the module."));
  await cp.appendMessage(assistant("Done: go.mod and main.go created."));
  const cu2 = await cp.appendMessage(user("Step 2: add an HTTP server."));
  await cp.appendMessage(assistant("Added net/http server on :8080."));
  await cp.appendCompaction("Scaffolded a Go module with an HTTP server.", cu2, 18000, { readFiles: ["go.mod"], modifiedFiles: ["main.go"] }, false, usage(18000, 300));
  await cp.appendMessage(user("Step 3: add a health endpoint."));
  const ca3 = await cp.appendMessage(assistant("Added GET /healthz."));
  const tail = [user("Step 3: add a health endpoint."), assistant("Added GET /healthz.")];
  await cp.appendCompaction("Module, HTTP server and /healthz exist.", undefined, 24000, undefined, true, usage(24000, 200), tail);
  await cp.appendMessage(user("Step 4: add graceful shutdown."));
  await cp.appendMessage(assistant("Added signal handling with http.Server.Shutdown."));
  out.push(await harnessItem("harness-compaction", cp, harnessRoot));

  // Large lines: a 3 MiB base64 image and a 600 KiB tool output (both above
  // the 512 KiB size at which Node's appendFile splits a line into writes).
  const im = await repo.create({ cwd: "/home/dev/beta" });
  await im.appendMessage(user("What is in this screenshot?", [bigImage(3 * 1024 * 1024)]));
  await im.appendMessage(assistant([{ type: "text", text: "A terminal. Let me dump the log." }, toolCall("call_log", "bash", { command: "cat build.log" })]));
  await im.appendMessage(toolResult("call_log", "bash", "x".repeat(600 * 1024 - 1) + "\n"));
  await im.appendMessage(assistant("The log shows a clean build."));
  out.push(await harnessItem("harness-image", im, harnessRoot));

  // A session Pi creates but never writes to: the header alone is on disk.
  const ho = await repo.create({ cwd: "/home/dev/gamma", metadata: { app: "pisync-conformance" } });
  out.push(await harnessItem("harness-header-only", ho, harnessRoot));

  // Forks are new files with new ids and parentSession = source path.
  // Whole file: every entry is copied verbatim, leaf entries included.
  const brMeta = await br.getMetadata();
  const fullFork = await repo.fork(brMeta, { cwd: "/home/dev/alpha" });
  await fullFork.appendMessage(user("Continuing in the fork."));
  out.push(await harnessItem("harness-fork-full", fullFork, harnessRoot, { forkOf: brMeta.id }));
  // At an entry: only the root-to-entry path is copied.
  const atFork = await repo.fork(brMeta, { cwd: "/home/dev/delta", entryId: a2b, position: "at" });
  out.push(await harnessItem("harness-fork-at", atFork, harnessRoot, { forkOf: brMeta.id }));
  // At an entry behind a compaction: the copied path stops at the compaction's
  // first kept entry, whose parentId then names an entry absent from the fork.
  const cpMeta = await cp.getMetadata();
  const cutFork = await repo.fork(cpMeta, { cwd: "/home/dev/beta", entryId: ca3, position: "at" });
  out.push(await harnessItem("harness-fork-after-compaction", cutFork, harnessRoot, { forkOf: cpMeta.id, danglingRootParent: true }));

  // Coding-agent CLI sessions, in Pi's default layout under <root>/cli.
  const { SessionManager, getDefaultSessionDir } = await loadCli();
  const agentDir = join(root, "cli");
  const cliRoot = join(agentDir, "sessions");
  const sm = SessionManager.create("/home/dev/epsilon", getDefaultSessionDir("/home/dev/epsilon", agentDir));
  sm.appendModelChange("anthropic", "claude-sonnet-4-5"); // held in memory until the first user message
  sm.appendThinkingLevelChange("low");
  const c1 = sm.appendMessage(user("Find TODOs in the repo."));
  sm.appendMessage(assistant([toolCall("call_g", "bash", { command: "grep -rn TODO ." })]));
  sm.appendMessage(toolResult("call_g", "bash", "main.go:12: // TODO: handle errors\n"));
  const c4 = sm.appendMessage(assistant("One TODO, in main.go line 12."));
  sm.appendSessionInfo("TODO hunt");
  sm.appendLabelChange(c1, "question");
  sm.appendCustomEntry("pisync-test/state", { step: 1 });
  sm.appendCustomMessageEntry("pisync-test/notice", [{ type: "text", text: "Reminder: run gofmt." }], false);
  sm.branch(c1); // in-memory only: the CLI writes no leaf record
  sm.appendMessage(assistant("Alternative answer: there are no TODOs."));
  sm.branchWithSummary(c4, "Tried an answer claiming no TODOs.");
  const c5 = sm.appendMessage(user("Fix it."));
  sm.appendMessage(assistant("Handled the error in main.go."));
  sm.appendCompaction("Found and fixed one TODO in main.go.", c5, 9000);
  sm.appendUsage("compaction", "anthropic", "claude-sonnet-4-5", usage(9000, 150));
  sm.appendContextEdit(c5, { content: "Fix it (edited)." });
  sm.appendMessage(user("Anything else?"));
  sm.appendMessage(assistant("No, that was the only one."));
  const cliBasicPath = sm.getSessionFile();
  out.push(cliItem("cli-basic", cliBasicPath, cliRoot, sm.getSessionId()));

  // /fork-style extraction of one branch into a new file.
  const src = SessionManager.open(cliBasicPath);
  const branchedPath = src.createBranchedSession(c4);
  out.push(cliItem("cli-branched", branchedPath, cliRoot, src.getSessionId(), { forkOf: sm.getSessionId() }));

  // Copy of a whole session into another project directory.
  const forked = SessionManager.forkFrom(cliBasicPath, "/home/dev/zeta", getDefaultSessionDir("/home/dev/zeta", agentDir));
  out.push(cliItem("cli-fork-from", forked.getSessionFile(), cliRoot, forked.getSessionId(), { forkOf: sm.getSessionId() }));

  // A legacy v1 file, left unmigrated (opening it with the CLI would rewrite it).
  const legacyDir = getDefaultSessionDir(V1_CWD, agentDir);
  const legacyId = randomUUID();
  const legacyPath = join(legacyDir, sessionFileName(legacyId));
  await writeV1File(legacyPath, legacyId);
  out.push({ ...cliItem("cli-v1", legacyPath, cliRoot, legacyId), format: "cli-v1" });

  return out;
}

// ---------------------------------------------------------------------------
// write-cli073 / append-cli073: sessions written by @mariozechner/pi-coding-agent
// 0.73.1 with its own SessionManager (it has no usage or context_edit entries).

async function writeCli073(agentDir) {
  const { SessionManager, getDefaultSessionDir } = await loadCli("cli-0.73");
  const root = resolve(agentDir);
  const sessionsRoot = join(root, "sessions");
  const item = (name, path, conversationId, extra = {}) =>
    ({ name, api: "cli-0.73", format: "cli-v3", path, sessionsRoot, conversationId, ...extra });
  const out = [];

  const sm = SessionManager.create("/home/dev/eta", getDefaultSessionDir("/home/dev/eta", root));
  sm.appendModelChange("anthropic", "claude-sonnet-4-5");
  sm.appendThinkingLevelChange("medium");
  const u1 = sm.appendMessage(user("Which tests are slow?"));
  sm.appendMessage(assistant([{ type: "text", text: "Timing them." }, toolCall("call_t", "bash", { command: "go test -json ./..." })]));
  sm.appendMessage(toolResult("call_t", "bash", "ok  demo/slow 4.20s\nok  demo/fast 0.01s\n"));
  const a2 = sm.appendMessage(assistant("demo/slow takes 4.2 s."));
  sm.appendSessionInfo("Slow tests");
  sm.appendLabelChange(u1, "question");
  sm.appendCustomEntry("pisync-test/state", { step: 1 });
  sm.appendCustomMessageEntry("pisync-test/notice", "Benchmarks run nightly.", true, { source: "ci" });
  sm.branch(u1); // in-memory only: the CLI writes no leaf record
  sm.appendMessage(assistant("Alternative answer: none is slow."));
  sm.branchWithSummary(a2, "Tried an answer claiming no slow test.");
  const u3 = sm.appendMessage(user("Speed demo/slow up."));
  sm.appendMessage(assistant("Replaced the sleep with a fake clock: 0.02 s.", { provider: "openai", model: "gpt-5" }));
  sm.appendModelChange("openai", "gpt-5");
  sm.appendCompaction("Found demo/slow and sped it up.", u3, 12000);
  sm.appendMessage(user("Thanks."));
  sm.appendMessage(assistant("You're welcome.", { provider: "openai", model: "gpt-5" }));
  out.push(item("cli073-basic", sm.getSessionFile(), sm.getSessionId()));

  // /fork-style extraction of one branch, and a copy into another project.
  const src = SessionManager.open(sm.getSessionFile());
  out.push(item("cli073-branched", src.createBranchedSession(a2), src.getSessionId(), { forkOf: sm.getSessionId() }));
  const forked = SessionManager.forkFrom(sm.getSessionFile(), "/home/dev/theta", getDefaultSessionDir("/home/dev/theta", root));
  out.push(item("cli073-fork-from", forked.getSessionFile(), forked.getSessionId(), { forkOf: sm.getSessionId() }));
  return out;
}

// appendCli073 opens an existing session with 0.73.1's SessionManager (as `pi
// --continue` does) and appends a user message and a reply count times.
async function appendCli073(path, count) {
  const { SessionManager } = await loadCli("cli-0.73");
  const sm = SessionManager.open(resolve(path));
  for (let i = 1; i <= count; i++) {
    sm.appendMessage(user(`Follow-up ${i}.`));
    sm.appendMessage(assistant(`Answer ${i}.`));
  }
  return { path: sm.getSessionFile(), conversationId: sm.getSessionId(), entries: sm.getEntries().length };
}

// ---------------------------------------------------------------------------
// write-v1 / migrate

// Pi's version-1 format (coding-agent before tree sessions): the header has no
// `version` and carries the initial model; entries have no id/parentId and form
// a line; compaction points at its first kept entry by index into the file's
// entries, header included (migrateV1ToV2 resolves it the same way).
const V1_CWD = "/home/dev/legacy";

// Pi's file name inside a project directory: <ISO time, : and . replaced by ->_<id>.jsonl.
function sessionFileName(id, date = new Date()) {
  return `${date.toISOString().replace(/[:.]/g, "-")}_${id}.jsonl`;
}

// Pi's project directory name under a sessions root (the coding-agent's
// getDefaultSessionDirPath): --<cwd without its leading separator, / \ : as ->--.
// The self-test checks it against getDefaultSessionDir.
function projectDirName(cwd) {
  return `--${resolve(cwd).replace(/^[/\\]/, "").replace(/[/\\:]/g, "-")}--`;
}

// write-v1's <path>: a .jsonl file as is, or a sessions root in which the file
// gets Pi's layout (<root>/--<cwd>--/<time>_<id>.jsonl) and a name with its id.
function v1Target(path) {
  const abs = resolve(path);
  if (abs.endsWith(".jsonl")) return { path: abs, id: randomUUID() };
  const id = randomUUID();
  return { path: join(abs, projectDirName(V1_CWD), sessionFileName(id)), id };
}

async function writeV1File(path, id = randomUUID()) {
  const ts = () => new Date().toISOString();
  const lines = [
    { type: "session", id, timestamp: ts(), cwd: V1_CWD, provider: "anthropic", modelId: "claude-sonnet-4-5", thinkingLevel: "off" },
    { type: "message", timestamp: ts(), message: user("Show me the Makefile.") },
    { type: "message", timestamp: ts(), message: assistant([toolCall("toolu_01", "read", { path: "Makefile" })]) },
    { type: "message", timestamp: ts(), message: toolResult("toolu_01", "read", "all:\n\tgo build ./...\n") },
    { type: "message", timestamp: ts(), message: assistant("It builds everything with go build.") },
    { type: "thinking_level_change", timestamp: ts(), thinkingLevel: "high" },
    { type: "model_change", timestamp: ts(), provider: "anthropic", modelId: "claude-opus-4-1" },
    { type: "message", timestamp: ts(), message: user("Add a test target.") },
    { type: "message", timestamp: ts(), message: assistant("Added `test: go test ./...`.", { model: "claude-opus-4-1" }) },
    { type: "compaction", timestamp: ts(), summary: "Read the Makefile and added a test target.", firstKeptEntryIndex: 7, tokensBefore: 4321 },
    { type: "message", timestamp: ts(), message: user("Run it.") },
    { type: "message", timestamp: ts(), message: assistant("All tests pass.", { model: "claude-opus-4-1" }) },
  ];
  await mkdir(dirname(path), { recursive: true });
  await writeFile(path, lines.map((l) => JSON.stringify(l) + "\n").join(""), { flag: "wx" });
  return { path, conversationId: id, format: "cli-v1", lines: lines.length };
}

async function migrate(path) {
  const abs = resolve(path);
  const before = await readFile(abs);
  const fromVersion = firstLineVersion(before);
  const { SessionManager } = await loadCli();
  const sm = SessionManager.open(abs); // migrates in memory and rewrites the file in place
  const after = await readFile(abs);
  return {
    path: abs, conversationId: sm.getSessionId(), fromVersion, toVersion: firstLineVersion(after),
    rewritten: !before.equals(after), entries: sm.getEntryCount(),
  };
}

function firstLineVersion(buf) {
  const nl = buf.indexOf(10);
  const header = JSON.parse(buf.subarray(0, nl < 0 ? buf.length : nl).toString("utf8"));
  return header.version ?? 1;
}

// ---------------------------------------------------------------------------
// live

async function live(path, { count, intervalMs, cwd, bytes }) {
  const abs = resolve(path);
  let session;
  let created = false;
  if (abs.endsWith(".jsonl")) {
    // An exact file: reopen it, or create it with Pi's storage at that path.
    if (await exists(abs)) {
      session = new Session(await JsonlSessionStorage.open(env, abs));
    } else {
      await mkdir(dirname(abs), { recursive: true });
      session = new Session(await JsonlSessionStorage.create(env, abs, { cwd, sessionId: createSessionId() }));
      created = true;
    }
  } else {
    // A sessions root: Pi picks the directory and file name.
    session = await new JsonlSessionRepo({ fs: env, sessionsRoot: abs }).create({ cwd });
    created = true;
  }
  const meta = await session.getMetadata();
  emit({ event: "session", path: meta.path, conversationId: meta.id, created });
  for (let i = 1; i <= count; i++) {
    if (i > 1 && intervalMs > 0) await sleep(intervalMs);
    const text = `live message ${i}`;
    const padded = bytes > text.length ? text + " " + "z".repeat(bytes - text.length - 1) : text;
    const msg = i % 2 === 1 ? user(padded) : assistant(padded);
    const id = await session.appendMessage(msg);
    emit({ event: "entry", n: i, id });
  }
}

// ---------------------------------------------------------------------------
// dump

async function dumpHarness(path) {
  const session = new Session(await JsonlSessionStorage.open(env, resolve(path)));
  const meta = await session.getMetadata();
  const entries = await session.getEntries();
  const ctx = await session.buildContext();
  return {
    loader: "harness",
    // The header as the harness understood it (it keeps only these fields).
    // The file's own path is left out so a rebuilt copy dumps identically.
    header: { type: "session", version: 3, id: meta.id, timestamp: meta.createdAt, cwd: meta.cwd, parentSession: meta.parentSessionPath, metadata: meta.metadata },
    sessionName: (await session.getSessionName()) ?? null,
    labels: await labelsOf(entries, (id) => session.getLabel(id)),
    entries,
    leafId: await session.getLeafId(),
    branch: (await session.getBranch()).map((e) => e.id),
    ...(await rootPath(await session.getLeafId(), (id) => session.getEntry(id))),
    context: { messages: ctx.messages, model: ctx.model, thinkingLevel: ctx.thinkingLevel, activeTools: ctx.activeToolNames },
  };
}

async function dumpCli(path, loader = "cli") {
  const abs = resolve(path);
  const { SessionManager } = await loadCli(loader);
  // SessionManager.open writes to the file it opens (v1/v2 migration, a
  // newline after a torn last line), so it opens a private copy: dump never
  // changes the file under test.
  const dir = await mkdtemp(join(tmpdir(), "pihelper-"));
  try {
    const copy = join(dir, basename(abs));
    await copyFile(abs, copy);
    let sm;
    try {
      sm = SessionManager.open(copy);
    } catch (err) {
      throw new Error(String(err?.message ?? err).split(copy).join(abs));
    }
    const entries = sm.getEntries();
    const ctx = sm.buildSessionContext();
    return {
      loader,
      header: sm.getHeader(),
      sessionName: sm.getSessionName() ?? null,
      labels: await labelsOf(entries, (id) => sm.getLabel(id)),
      entries,
      leafId: sm.getLeafId(),
      branch: sm.getBranch().map((e) => e.id),
      ...(await rootPath(sm.getLeafId(), (id) => sm.getEntry(id))),
      // The CLI derives no active tools from a session.
      context: { messages: ctx.messages, model: ctx.model, thinkingLevel: ctx.thinkingLevel, activeTools: null },
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function dumpWith(loader, path) {
  return loader === "harness" ? dumpHarness(path) : dumpCli(path, loader);
}

// dump-many: every path loaded in this one process (a Node start costs about a
// second), each with its own loader. A file Pi refuses does not stop the others:
// its value is {"error": "<Pi's message>"}, and the exit code is 1.
async function dumpMany(requests) {
  const out = {};
  let failed = false;
  for (const { path, loader } of requests) {
    try {
      out[path] = { dump: await dumpWith(loader, path) };
    } catch (err) {
      out[path] = { error: String(err?.message ?? err) };
      failed = true;
    }
  }
  return { out, failed };
}

// dump-many's command line: --loader applies to the paths after it.
function parseDumpMany(args) {
  const requests = [];
  const seen = new Set();
  let loader = "harness";
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg.startsWith("--")) {
      const [name, inline] = arg.slice(2).split(/=(.*)/s);
      if (name !== "loader") throw new UsageError(`unknown flag --${name}`);
      const value = inline ?? args[++i];
      loader = checkLoader(value);
      continue;
    }
    if (seen.has(arg)) throw new UsageError(`path given twice: ${arg}`);
    seen.add(arg);
    requests.push({ path: arg, loader });
  }
  if (requests.length === 0) throw new UsageError("expected at least one <path>");
  return requests;
}

async function labelsOf(entries, getLabel) {
  const labels = {};
  for (const e of entries) {
    const label = await getLabel(e.id);
    if (label !== undefined) labels[e.id] = label;
  }
  return labels;
}

// The full root-to-leaf walk by parentId. The harness getBranch() stops at a
// compaction boundary; pisync needs the whole chain, and needs to know when a
// parent is missing (forks cut behind a compaction produce such files).
async function rootPath(leafId, getEntry) {
  const path = [];
  let danglingParentId = null;
  let id = leafId;
  while (id) {
    const entry = await getEntry(id);
    if (!entry) {
      danglingParentId = id;
      break;
    }
    path.unshift(entry.id);
    id = entry.parentId;
  }
  return { rootPath: path, danglingParentId };
}

// ---------------------------------------------------------------------------
// Output and command line

// Sorted keys at every level: the same session always prints the same bytes.
function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    const out = {};
    for (const key of Object.keys(value).sort()) {
      if (value[key] !== undefined) out[key] = canonical(value[key]);
    }
    return out;
  }
  return value;
}

// Multi-MB dumps must not be cut short, so we never call process.exit():
// stdout drains before Node exits on its own.
function emit(value) {
  process.stdout.write(JSON.stringify(canonical(value)) + "\n");
}

async function exists(path) {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

function parseFlags(args, spec) {
  const flags = {};
  const positional = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (!arg.startsWith("--")) {
      positional.push(arg);
      continue;
    }
    const [name, inline] = arg.slice(2).split(/=(.*)/s);
    if (!(name in spec)) throw new UsageError(`unknown flag --${name}`);
    const value = inline ?? args[++i];
    if (value === undefined) throw new UsageError(`flag --${name} needs a value`);
    flags[name] = spec[name](value, name);
  }
  return { flags, positional };
}

function nonNegativeInt(value, name) {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new UsageError(`--${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
  return n;
}

const USAGE = `usage: pihelper.mjs <command> ...
  write-scenarios <rootDir>        write scenario sessions with Pi; prints the manifest
  write-v1 <path>                  write a legacy version-1 session file; <path> is a .jsonl file
                                   or a sessions root (Pi's layout and file name)
  migrate <path>                   open <path> with the CLI SessionManager (migrates v1/v2 in place)
  live <path> [--count N] [--interval-ms M] [--cwd DIR] [--bytes N]
                                   append N messages to a harness session, one JSON line each;
                                   <path> is a .jsonl file (opened or created) or a sessions root
  write-cli073 <agentDir>          write sessions with @mariozechner/pi-coding-agent 0.73.1 under
                                   <agentDir>/sessions; prints the manifest (api cli-0.73)
  append-cli073 <path> [--count N] open <path> with 0.73.1's SessionManager, append N exchanges
  dump <path> [--loader harness|cli|cli-0.73]
                                   load <path> with Pi and print a canonical JSON dump
  dump-many [--loader harness|cli|cli-0.73] <path>... [--loader L <path>...]
                                   dump several files in one process: a JSON object keyed by
                                   path, {"dump": ...} or {"error": ...}; --loader applies to
                                   the paths after it`;

function one(positional, what) {
  if (positional.length !== 1) throw new UsageError(`expected exactly one ${what}`);
  return positional[0];
}

async function main(argv) {
  const [command, ...args] = argv;
  switch (command) {
    case "write-scenarios": {
      const { positional } = parseFlags(args, {});
      const root = resolve(one(positional, "<rootDir>"));
      const items = await writeScenarios(root);
      emit(items.map((item) => ({ ...item, relPath: relative(item.sessionsRoot, item.path) })));
      return;
    }
    case "write-cli073": {
      const { positional } = parseFlags(args, {});
      const items = await writeCli073(one(positional, "<agentDir>"));
      emit(items.map((item) => ({ ...item, relPath: relative(item.sessionsRoot, item.path) })));
      return;
    }
    case "append-cli073": {
      const { flags, positional } = parseFlags(args, { count: nonNegativeInt });
      emit(await appendCli073(one(positional, "<path>"), flags.count ?? 2));
      return;
    }
    case "write-v1": {
      const { positional } = parseFlags(args, {});
      const { path, id } = v1Target(one(positional, "<path>"));
      emit(await writeV1File(path, id));
      return;
    }
    case "migrate": {
      const { positional } = parseFlags(args, {});
      emit(await migrate(one(positional, "<path>")));
      return;
    }
    case "live": {
      const { flags, positional } = parseFlags(args, {
        count: nonNegativeInt, "interval-ms": nonNegativeInt, cwd: String, bytes: nonNegativeInt,
      });
      await live(one(positional, "<path>"), {
        count: flags.count ?? 10, intervalMs: flags["interval-ms"] ?? 100, cwd: flags.cwd ?? "/home/dev/live", bytes: flags.bytes ?? 0,
      });
      return;
    }
    case "dump": {
      const { flags, positional } = parseFlags(args, { loader: checkLoader });
      emit(await dumpWith(flags.loader ?? "harness", one(positional, "<path>")));
      return;
    }
    case "dump-many": {
      const { out, failed } = await dumpMany(parseDumpMany(args));
      emit(out);
      if (failed) process.exitCode = 1;
      return;
    }
    case undefined:
    case "help":
    case "--help":
      process.stdout.write(USAGE + "\n");
      return;
    default:
      throw new UsageError(`unknown command ${JSON.stringify(command)}`);
  }
}

main(process.argv.slice(2)).catch((err) => {
  if (err instanceof UsageError) {
    process.stderr.write(`pihelper: ${err.message}\n${USAGE}\n`);
    process.exitCode = 2;
  } else {
    process.stderr.write(`pihelper: ${err?.message ?? err}\n`);
    process.exitCode = 1;
  }
});
