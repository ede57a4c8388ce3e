// `npm run bench`: append latency of Pi's Session on NatsSessionRepo (through a real
// `pisync serve` on loopback) against Pi's own JsonlSessionRepo, and the time to open a
// session of 10,000 entries. Prints one JSON object; bench/RESULTS.md quotes it.
//
// Also appends/s with BENCH_SESSIONS sessions (default 100) each appending
// BENCH_SESSION_APPENDS (default 50) one after the other, all sessions at once, on one
// connection.
//
//   BENCH_APPENDS (default 2000), BENCH_OPEN_ENTRIES (10000), BENCH_OPENS (5)

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { JsonlSessionRepo, type Session } from "@earendil-works/pi-agent-core";
import { NodeExecutionEnv } from "@earendil-works/pi-agent-core/node";
import { NatsSessionRepo } from "../src/index.js";
import { Store } from "./harness.js";

const appends = Number(process.env.BENCH_APPENDS ?? 2000);
const openEntries = Number(process.env.BENCH_OPEN_ENTRIES ?? 10000);
const opens = Number(process.env.BENCH_OPENS ?? 5);
const sessions = Number(process.env.BENCH_SESSIONS ?? 100);
const sessionAppends = Number(process.env.BENCH_SESSION_APPENDS ?? 50);

// message is a typical chat turn of about 1 KiB.
function message(i: number) {
  const text = `message ${i} `.padEnd(1000, "x");
  return { role: "user", content: [{ type: "text", text }], timestamp: Date.now() } as never;
}

function quantile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

async function appendLatency(session: Session<never> | Session, n: number) {
  const ms: number[] = [];
  for (let i = 0; i < 100; i++) await session.appendMessage(message(i)); // warm-up
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await session.appendMessage(message(i));
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  const total = ms.reduce((a, b) => a + b, 0);
  return { n, p50_ms: +quantile(ms, 0.5).toFixed(3), p99_ms: +quantile(ms, 0.99).toFixed(3), max_ms: +ms[ms.length - 1]!.toFixed(3), per_s: Math.round((n * 1000) / total) };
}

async function main() {
  const store = await Store.start();
  const dir = mkdtempSync(join(tmpdir(), "pss-bench-"));
  const repo = new NatsSessionRepo({ servers: store.url, tenant: "bench", owner: "bench" });
  try {
    const jsonl = new JsonlSessionRepo({ fs: new NodeExecutionEnv({ cwd: dir }), sessionsRoot: dir });
    const jsonlAppend = await appendLatency(await jsonl.create({ cwd: "/bench" }), appends);
    const storeAppend = await appendLatency(await repo.create({ cwd: "/bench" }), appends);

    const big = await repo.create({ cwd: "/bench/open" });
    for (let i = 0; i < openEntries; i++) await big.appendMessage(message(i));
    const meta = await big.getMetadata();
    const openMs: number[] = [];
    let count = 0;
    for (let i = 0; i < opens; i++) {
      const t0 = performance.now();
      const s = await repo.open(meta);
      openMs.push(performance.now() - t0);
      count = (await s.getEntries()).length;
    }
    openMs.sort((a, b) => a - b);
    const jsonlBig = await jsonl.create({ cwd: "/bench/open" });
    for (let i = 0; i < openEntries; i++) await jsonlBig.appendMessage(message(i));
    const jsonlOpenMs: number[] = [];
    for (let i = 0; i < opens; i++) {
      const t0 = performance.now();
      await jsonl.open(await jsonlBig.getMetadata());
      jsonlOpenMs.push(performance.now() - t0);
    }
    jsonlOpenMs.sort((a, b) => a - b);
    const many = await Promise.all(Array.from({ length: sessions }, () => repo.create({ cwd: "/bench/many" })));
    const t0 = performance.now();
    await Promise.all(
      many.map(async (s) => {
        for (let i = 0; i < sessionAppends; i++) await s.appendMessage(message(i));
      }),
    );
    const concurrentMs = performance.now() - t0;
    const result = {
      node: process.version,
      append_store: storeAppend,
      append_jsonl: jsonlAppend,
      append_p50_ratio: +(storeAppend.p50_ms / jsonlAppend.p50_ms).toFixed(1),
      open_store: { entries: count, median_ms: +quantile(openMs, 0.5).toFixed(1), max_ms: +openMs[openMs.length - 1]!.toFixed(1) },
      concurrent_store: { sessions, appends: sessions * sessionAppends, per_s: Math.round((sessions * sessionAppends * 1000) / concurrentMs) },
      open_jsonl: { entries: openEntries, median_ms: +quantile(jsonlOpenMs, 0.5).toFixed(1), max_ms: +jsonlOpenMs[jsonlOpenMs.length - 1]!.toFixed(1) },
    };
    process.stdout.write(JSON.stringify(result, null, 2) + "\n");
  } finally {
    await repo.close();
    await store.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`bench: ${err?.stack ?? err}\n`);
  process.exitCode = 1;
});
