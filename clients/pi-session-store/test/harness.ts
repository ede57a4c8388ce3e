// The test harness runs the real service: a nats-server with JetStream and `pisync serve`,
// both built from this repository's Go module (no fake of the store anywhere).
//
// PISYNC_BIN and NATS_SERVER_BIN name binaries to use instead of building them.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { connect, type NatsConnection } from "@nats-io/transport-node";

/** moduleRoot is the Go module root: build/test/ is four levels below it. */
export const moduleRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

let built: { pisync: string; natsServer: string } | undefined;

/** binaries builds pisync and nats-server once per process (Go's cache makes it quick). */
export function binaries(): { pisync: string; natsServer: string } {
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "pi-session-store-bin-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const build = (out: string, pkg: string) => {
    const r = spawnSync("go", ["build", "-o", out, pkg], { cwd: moduleRoot, encoding: "utf8" });
    if (r.status !== 0) throw new Error(`go build ${pkg}: ${r.error ?? ""}${r.stderr}`);
    return out;
  };
  built = {
    pisync: process.env.PISYNC_BIN || build(join(dir, "pisync"), "./cmd/pisync"),
    natsServer: process.env.NATS_SERVER_BIN || build(join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"),
  };
  return built;
}

async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => ok(port));
    });
  });
}

/** Proc is a child process whose output is kept for the failure message. */
class Proc {
  output = "";
  exited: Promise<number | null>;
  constructor(readonly name: string, readonly child: ChildProcess) {
    child.stdout?.on("data", (b: Buffer) => (this.output += b.toString()));
    child.stderr?.on("data", (b: Buffer) => (this.output += b.toString()));
    this.exited = new Promise((ok) => child.on("exit", (code) => ok(code)));
  }
  kill(signal: NodeJS.Signals = "SIGTERM"): Promise<number | null> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exited;
  }
}

/** Store is a running nats-server plus `pisync serve`. */
export class Store {
  private serves: Proc[] = [];
  private constructor(
    readonly url: string,
    private readonly nats: Proc,
    private readonly dir: string,
    private readonly auth: boolean,
  ) {}

  /** Users of the authenticated server (start with `auth`): the service, and owners. */
  static readonly serveUser = { user: "serve", pass: "serve-secret" };

  /**
   * start runs nats-server (JetStream in a temp directory) and one `pisync serve`. With
   * auth, the server has one account with the user of the service and a user per name in
   * owners (password `<name>-secret`), fenced as docs/store-protocol.md says: requests only
   * on pisync.store.t1.<name>.>, replies only on _INBOX.t1.<name>.>.
   */
  static async start(options: { auth?: { owners: string[] }; maxPayload?: number } = {}): Promise<Store> {
    const bin = binaries();
    const dir = mkdtempSync(join(tmpdir(), "pi-session-store-"));
    const port = await freePort();
    let args = ["-a", "127.0.0.1", "-p", String(port), "-js", "-sd", join(dir, "js")];
    if (options.auth) {
      const owners = options.auth.owners.map(
        (o) => `{ user: ${o}, password: ${o}-secret, permissions: { publish: { allow: ["pisync.store.t1.${o}.>"] }, subscribe: { allow: ["_INBOX.t1.${o}.>"] } } }`,
      );
      const conf = join(dir, "nats.conf");
      writeFileSync(
        conf,
        `listen: "127.0.0.1:${port}"\njetstream { store_dir: "${join(dir, "js")}" }\n` +
          `accounts { T1 { jetstream: enabled, users: [ { user: ${Store.serveUser.user}, password: ${Store.serveUser.pass} }, ${owners.join(", ")} ] } }\n`,
      );
      args = ["-c", conf];
    } else if (options.maxPayload !== undefined) {
      // max_payload has no command-line flag: a configuration file sets it.
      const conf = join(dir, "nats.conf");
      writeFileSync(conf, `listen: "127.0.0.1:${port}"\njetstream { store_dir: "${join(dir, "js")}" }\nmax_payload: ${options.maxPayload}\n`);
      args = ["-c", conf];
    }
    const nats = new Proc("nats-server", spawn(bin.natsServer, args));
    const store = new Store(`nats://127.0.0.1:${port}`, nats, dir, options.auth !== undefined);
    await store.waitNats();
    await store.startServe();
    return store;
  }

  private async waitNats(): Promise<void> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      try {
        const nc = await connect({ ...this.credentials(), servers: this.url, reconnect: false });
        await nc.close();
        return;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`nats-server did not come up: ${err}\n${this.nats.output}`);
        await sleep(50);
      }
    }
  }

  /** startServe starts one more `pisync serve` replica and waits until it answers. */
  async startServe(): Promise<Proc> {
    const bin = binaries();
    const args = ["serve", "--nats", this.url, "--http-addr", "127.0.0.1:0"];
    const env: NodeJS.ProcessEnv = { ...process.env };
    if (this.auth) {
      args.push("--nats-user", Store.serveUser.user);
      env.PISYNC_NATS_PASSWORD = Store.serveUser.pass;
    }
    const serve = new Proc("pisync serve", spawn(bin.pisync, args, { env }));
    this.serves.push(serve);
    const nc = await this.connect();
    try {
      const deadline = Date.now() + 30_000;
      for (;;) {
        try {
          await nc.request("pisync.store.probe.probe.list", "{}", { timeout: 1000 });
          return serve;
        } catch (err) {
          if (serve.child.exitCode !== null) throw new Error(`pisync serve exited ${serve.child.exitCode}:\n${serve.output}`);
          if (Date.now() > deadline) throw new Error(`pisync serve did not answer: ${err}\n${serve.output}`);
          await sleep(50);
        }
      }
    } finally {
      await nc.close();
    }
  }

  /** serveProcesses are the replicas started, oldest first. */
  get serveProcesses(): Proc[] {
    return this.serves;
  }

  /** connect connects as the service's user (any subject, any inbox). */
  connect(): Promise<NatsConnection> {
    return connect({ ...this.credentials(), servers: this.url });
  }

  private credentials(): { user?: string; pass?: string } {
    return this.auth ? { ...Store.serveUser } : {};
  }

  /** logs is what the processes printed, for a failing test's message. */
  logs(): string {
    return [this.nats, ...this.serves].map((p) => `--- ${p.name}\n${p.output}`).join("\n");
  }

  async stop(): Promise<void> {
    for (const s of this.serves) await s.kill();
    await this.nats.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
