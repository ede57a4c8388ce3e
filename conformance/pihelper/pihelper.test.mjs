// Self-test: runs pihelper.mjs as the Go suite will (a child process) and
// checks that what real Pi wrote and read back is self-consistent.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, relative } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

const helper = fileURLToPath(new URL("./pihelper.mjs", import.meta.url));

function run(...args) {
  return new Promise((resolve) => {
    execFile(process.execPath, [helper, ...args], { maxBuffer: 1 << 30 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr });
    });
  });
}

async function runJSON(...args) {
  const r = await run(...args);
  assert.equal(r.code, 0, `pihelper ${args.join(" ")} failed: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

const loaderOf = (item) => (item.api === "cli" ? "cli" : "harness");

let dir;
let manifest;
const byName = {};

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "pihelper-test-"));
  manifest = await runJSON("write-scenarios", join(dir, "sessions"));
  for (const item of manifest) byName[item.name] = item;
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test("manifest lists every scenario with Pi's file naming", () => {
  const expected = [
    "harness-basic", "harness-branching", "harness-compaction", "harness-image", "harness-header-only",
    "harness-fork-full", "harness-fork-at", "harness-fork-after-compaction",
    "cli-basic", "cli-branched", "cli-fork-from", "cli-v1",
  ];
  assert.deepEqual(manifest.map((m) => m.name), expected);
  for (const item of manifest) {
    assert.ok(["harness", "cli"].includes(item.api), item.name);
    assert.match(basename(item.path), new RegExp(`^\\d{4}-\\d\\d-\\d\\dT\\d\\d-\\d\\d-\\d\\d-\\d{3}Z_${item.conversationId}\\.jsonl$`), item.name);
    assert.match(item.relPath, /^--[^/]+--\/[^/]+\.jsonl$/, item.name);
  }
  assert.equal(new Set(manifest.map((m) => m.conversationId)).size, manifest.length, "conversation ids are unique");
});

test("every v3 scenario dumps consistently and deterministically", async () => {
  for (const item of manifest.filter((m) => m.format !== "cli-v1")) {
    const first = await run("dump", item.path, "--loader", loaderOf(item));
    assert.equal(first.code, 0, `${item.name}: ${first.stderr}`);
    const again = await run("dump", item.path, "--loader", loaderOf(item));
    assert.equal(again.stdout, first.stdout, `${item.name}: dump is deterministic`);
    const d = JSON.parse(first.stdout);

    assert.equal(d.header.id, item.conversationId, item.name);
    const ids = d.entries.map((e) => e.id);
    assert.equal(new Set(ids).size, ids.length, `${item.name}: entry ids are unique`);
    if (d.entries.length === 0) {
      assert.equal(d.leafId, null, item.name);
      assert.deepEqual(d.branch, [], item.name);
      continue;
    }
    assert.ok(ids.includes(d.leafId), `${item.name}: leaf ${d.leafId} is an entry`);
    assert.equal(d.branch.at(-1), d.leafId, `${item.name}: branch ends at the leaf`);
    assert.equal(d.rootPath.at(-1), d.leafId, `${item.name}: root path ends at the leaf`);
    assert.deepEqual(d.rootPath.slice(-d.branch.length), d.branch, `${item.name}: branch is the tail of the root path`);
    const rootEntry = d.entries.find((e) => e.id === d.rootPath[0]);
    if (item.danglingRootParent) {
      assert.ok(d.danglingParentId, `${item.name}: fork behind a compaction has a missing parent`);
      assert.equal(rootEntry.parentId, d.danglingParentId, item.name);
    } else {
      assert.equal(d.danglingParentId, null, item.name);
      assert.equal(rootEntry.parentId, null, `${item.name}: the root path reaches a root entry`);
    }
    assert.ok(d.context.messages.length > 0, `${item.name}: context has messages`);
  }
});

test("harness files carry leaf entries and the leaf they point to", async () => {
  const item = byName["harness-branching"];
  const d = await runJSON("dump", item.path);
  const leaves = d.entries.filter((e) => e.type === "leaf");
  assert.equal(leaves.length, 4);
  assert.ok(leaves.some((e) => e.targetId === null), "moveTo(null) writes targetId null");
  assert.equal(d.entries.at(-1).type, "leaf", "the file ends on a leaf entry");
  assert.equal(d.leafId, item.expectedLeafId);
  assert.equal(d.leafId, d.entries.at(-1).targetId);
  const summary = d.entries.find((e) => e.type === "branch_summary");
  assert.equal(d.entries[d.entries.indexOf(summary) - 1].type, "leaf", "a summary follows its leaf entry");

  // The raw file holds the same lines, in the same order.
  const lines = (await readFile(item.path, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(lines.slice(1).map((l) => l.id), d.entries.map((e) => e.id));

  // The fork of the whole file copies the leaf entries too.
  const fork = await runJSON("dump", byName["harness-fork-full"].path);
  assert.equal(fork.entries.filter((e) => e.type === "leaf").length, 4);
  assert.equal(fork.header.parentSession, item.path);
});

test("harness-basic holds every configuration entry type", async () => {
  const d = await runJSON("dump", byName["harness-basic"].path);
  const types = new Set(d.entries.map((e) => e.type));
  for (const t of ["message", "model_change", "thinking_level_change", "active_tools_change", "label", "session_info", "custom", "custom_message"]) {
    assert.ok(types.has(t), `has ${t}`);
  }
  assert.deepEqual(d.context.activeTools, ["read", "bash"]);
  assert.deepEqual(d.context.model, { provider: "openai", modelId: "gpt-5" });
  assert.equal(d.context.thinkingLevel, "high");
  assert.equal(d.sessionName, "Explore the demo project");
  assert.deepEqual(Object.values(d.labels), ["start"]);
  assert.deepEqual(d.header.metadata, { app: "pisync-conformance", tenant: "t1" });
});

test("the image scenario has a multi-MB line, written and read back whole", async () => {
  const item = byName["harness-image"];
  const lines = (await readFile(item.path, "utf8")).trimEnd().split("\n");
  const sizes = lines.map((l) => Buffer.byteLength(l));
  assert.ok(sizes.some((n) => n > 3 * 1024 * 1024), `a line over 3 MiB: ${sizes}`);
  assert.ok(sizes.some((n) => n > 512 * 1024 && n < 1024 * 1024), `a line between 512 KiB and 1 MiB: ${sizes}`);
  const d = await runJSON("dump", item.path);
  const image = d.context.messages[0].content.find((c) => c.type === "image");
  assert.equal(image.data.length, 3 * 1024 * 1024);
});

test("cli files read the same with both loaders", async () => {
  for (const name of ["cli-basic", "cli-branched", "cli-fork-from"]) {
    const cli = await runJSON("dump", byName[name].path, "--loader", "cli");
    const harness = await runJSON("dump", byName[name].path, "--loader", "harness");
    assert.deepEqual(harness.entries, cli.entries, name);
    assert.equal(harness.leafId, cli.leafId, name);
    assert.ok(!cli.entries.some((e) => e.type === "leaf"), `${name}: the CLI writes no leaf entries`);
  }
});

test("v1: refused by the harness, migrated in place by the CLI", async () => {
  const legacy = byName["cli-v1"];
  const before = await readFile(legacy.path);
  const refused = await run("dump", legacy.path);
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, /unsupported session version/);
  const viaCli = await runJSON("dump", legacy.path, "--loader", "cli");
  assert.equal(viaCli.header.version, 3);
  assert.ok((await readFile(legacy.path)).equals(before), "dump does not modify the file");

  const path = join(dir, "v1", "legacy.jsonl");
  const written = await runJSON("write-v1", path);
  const header = JSON.parse((await readFile(path, "utf8")).split("\n")[0]);
  assert.equal(header.version, undefined);
  const migrated = await runJSON("migrate", path);
  assert.deepEqual(
    { fromVersion: migrated.fromVersion, toVersion: migrated.toVersion, rewritten: migrated.rewritten, id: migrated.conversationId },
    { fromVersion: 1, toVersion: 3, rewritten: true, id: written.conversationId },
  );
  // The migrated file is a plain v3 file: the harness now opens it.
  const d = await runJSON("dump", path);
  assert.equal(d.entries.length, written.lines - 1);
  assert.equal(d.entries[0].parentId, null);
  const compaction = d.entries.find((e) => e.type === "compaction");
  assert.equal(compaction.firstKeptEntryId, d.entries[6].id, "firstKeptEntryIndex 7 (header counted) became an id");
  assert.equal((await runJSON("migrate", path)).rewritten, false, "a v3 file is left alone");
});

test("write-v1 into a sessions root uses Pi's layout and names the file by its id", async () => {
  const root = join(dir, "v1-root");
  const written = await runJSON("write-v1", root);
  const rel = relative(root, written.path);
  assert.match(rel, new RegExp(`^--home-dev-legacy--/\\d{4}-\\d\\d-\\d\\dT\\d\\d-\\d\\d-\\d\\d-\\d{3}Z_${written.conversationId}\\.jsonl$`));
  // The same project directory as Pi's getDefaultSessionDir (used by write-scenarios).
  assert.equal(dirname(rel), dirname(byName["cli-v1"].relPath));
  const header = JSON.parse((await readFile(written.path, "utf8")).split("\n")[0]);
  assert.equal(header.id, written.conversationId);
  assert.equal(header.version, undefined);
});

test("dump-many dumps each path as dump does, keyed by path, and reports refusals", async () => {
  const harness = ["harness-basic", "harness-branching", "harness-image"].map((n) => byName[n].path);
  const cli = ["cli-basic", "cli-v1"].map((n) => byName[n].path);
  const missing = join(dir, "missing.jsonl");
  const r = await run("dump-many", ...harness, missing, "--loader", "cli", ...cli);
  assert.equal(r.code, 1, "a refused file makes the exit code 1");
  const many = JSON.parse(r.stdout);
  assert.deepEqual(Object.keys(many).sort(), [...harness, missing, ...cli].sort());
  assert.match(many[missing].error, /ENOENT|no such file/i);
  assert.equal(many[missing].dump, undefined);
  for (const [paths, loader] of [[harness, "harness"], [["cli-basic"].map((n) => byName[n].path), "cli"]]) {
    for (const path of paths) {
      const one = await run("dump", path, "--loader", loader);
      assert.equal(one.code, 0, one.stderr);
      assert.equal(JSON.stringify(many[path].dump) + "\n", one.stdout, `${path}: same bytes as dump`);
    }
  }
  // The v1 file migrates (in a private copy) to random ids: same shape, other ids.
  assert.equal(many[byName["cli-v1"].path].dump.header.version, 3);

  const ok = await run("dump-many", byName["harness-header-only"].path);
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(JSON.parse(ok.stdout)[byName["harness-header-only"].path].dump.leafId, null);
  assert.equal((await run("dump-many")).code, 2, "no path: usage error");
  assert.equal((await run("dump-many", "a.jsonl", "a.jsonl")).code, 2, "a path twice: usage error");
  assert.equal((await run("dump-many", "--loader", "x", "a.jsonl")).code, 2, "bad loader: usage error");
});

test("live appends messages and reports their ids", async () => {
  const path = join(dir, "live", "live.jsonl");
  const r = await run("live", path, "--count", "3", "--interval-ms", "10");
  assert.equal(r.code, 0, r.stderr);
  const events = r.stdout.trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(events[0].event, "session");
  assert.equal(events[0].created, true);
  const ids = events.slice(1).map((e) => e.id);
  assert.equal(ids.length, 3);
  const d = await runJSON("dump", path);
  assert.deepEqual(d.entries.map((e) => e.id), ids);
  assert.deepEqual(d.branch, ids);
  assert.equal(d.header.id, events[0].conversationId);
});

test("a malformed or missing file is refused with Pi's message", async () => {
  // A torn last line, as a crashed writer leaves it.
  const torn = join(dir, "torn.jsonl");
  await writeFile(torn, '{"type":"session","version":3,"id":"x","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/"}\n{"type":"message","id":"a');
  const r = await run("dump", torn);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^pihelper: Invalid JSONL session file .*torn\.jsonl: line 2 is not valid JSON/);
  assert.equal(r.stdout, "");
  assert.equal((await run("dump", join(dir, "missing.jsonl"))).code, 1);
  assert.equal((await run("dump")).code, 2, "usage error");
});

test("pi-coding-agent 0.73.1: its sessions read alike in 0.73.1 and the current CLI; append-cli073 only appends", async () => {
  const items = await runJSON("write-cli073", join(dir, "cli073"));
  assert.deepEqual(items.map((m) => m.name), ["cli073-basic", "cli073-branched", "cli073-fork-from"]);
  for (const item of items) {
    assert.equal(item.api, "cli-0.73", item.name);
    assert.equal(item.sessionsRoot, join(dir, "cli073", "sessions"), item.name);
    const old = await runJSON("dump", item.path, "--loader", "cli-0.73");
    const cur = await runJSON("dump", item.path, "--loader", "cli");
    assert.equal(old.loader, "cli-0.73");
    assert.deepEqual(old.entries, cur.entries, item.name);
    assert.equal(old.leafId, cur.leafId, item.name);
    assert.deepEqual(old.context.messages, cur.context.messages, item.name);
  }
  const basic = items[0].path;
  const before = await readFile(basic);
  const r = await runJSON("append-cli073", basic, "--count", "2");
  const after = await readFile(basic);
  assert.equal(r.path, basic);
  assert.ok(after.subarray(0, before.length).equals(before), "the file was rewritten, not appended to");
  assert.equal(after.toString().trimEnd().split("\n").length - before.toString().trimEnd().split("\n").length, 4);
});
