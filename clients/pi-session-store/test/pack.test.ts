// npm pack must give a package that works as it is installed: built by the pack itself
// (a tarball or a git dependency is never built by hand first), with its entry points.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

/** packageDir is clients/pi-session-store: build/test/ is two levels below it. */
const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

// run runs cmd as a user's shell would: without the npm_* variables of the `npm test`
// this may run under, which make a nested npm skip the lifecycle scripts under test.
function run(cmd: string, args: string[], cwd: string): string {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith("npm_")));
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", env });
  assert.equal(r.status, 0, `${cmd} ${args.join(" ")}: ${r.error ?? ""}${r.stdout}${r.stderr}`);
  return r.stdout;
}

test("npm pack of a checkout without dist/ gives a package that imports", () => {
  const dir = mkdtempSync(join(tmpdir(), "pi-session-store-pack-"));
  try {
    // A checkout as git gives it: sources, no dist/; the dependencies installed.
    const src = join(dir, "src");
    mkdirSync(src);
    for (const f of ["package.json", "package-lock.json", "tsconfig.json", "README.md", "src"]) {
      cpSync(join(packageDir, f), join(src, f), { recursive: true });
    }
    symlinkSync(join(packageDir, "node_modules"), join(src, "node_modules"), "dir");
    assert.ok(!existsSync(join(src, "dist")));

    const out = join(dir, "out");
    mkdirSync(out);
    run("npm", ["pack", "--pack-destination", out, "--loglevel=error"], src);
    const [tarball] = readdirSync(out).filter((f) => f.endsWith(".tgz"));
    assert.ok(tarball, "npm pack wrote no tarball");
    const ext = join(dir, "ext");
    mkdirSync(ext);
    run("tar", ["-xzf", join(out, tarball), "-C", ext], dir);
    const pkg = join(ext, "package");
    for (const f of ["dist/index.js", "dist/index.d.ts", "package.json", "README.md"]) {
      assert.ok(existsSync(join(pkg, f)), `${f} missing from the package`);
    }
    // Installed next to its dependencies, it imports and exports the repository.
    symlinkSync(join(packageDir, "node_modules"), join(ext, "node_modules"), "dir");
    const script = `import(${JSON.stringify(join(pkg, "dist/index.js"))}).then((m) => console.log(typeof m.NatsSessionRepo, typeof m.NatsSessionStorage))`;
    assert.equal(run("node", ["-e", script], dir).trim(), "function function");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
