/**
 * Run storage/d1/worker/worker.js under miniflare on 127.0.0.1, with a local D1 database and R2 bucket persisted
 * to a directory: the D1 profile's local stand-in for a Cloudflare account (run.journal.d1-profile;
 * tests/support/start_miniflare.py starts it, docs/store.md "The D1 profile").
 *
 *   node storage/d1/worker/miniflare.mjs <persist-dir>        (the token comes from CONTEXTFUL_D1_TOKEN)
 *
 * Prints one line "URL=http://127.0.0.1:<port>" once the Worker answers, then serves until it is
 * sent SIGTERM or SIGINT. The bindings match wrangler.toml's: DB (D1), BUCKET (R2), and the
 * CONTEXTFUL_D1_TOKEN secret.
 */

import { fileURLToPath } from "node:url";
import path from "node:path";
import { Miniflare } from "miniflare";

const persist = process.argv[2];
const token = process.env.CONTEXTFUL_D1_TOKEN;
if (!persist || !token) {
  console.error("usage: CONTEXTFUL_D1_TOKEN=<token> node storage/d1/worker/miniflare.mjs <persist-dir>");
  process.exit(2);
}

const here = path.dirname(fileURLToPath(import.meta.url));
const mf = new Miniflare({
  modules: true,
  scriptPath: path.join(here, "worker.js"),
  compatibilityDate: "2025-01-01",
  host: "127.0.0.1",
  port: 0,
  d1Databases: { DB: "contextful" },
  r2Buckets: { BUCKET: "contextful" },
  d1Persist: path.join(persist, "d1"),
  r2Persist: path.join(persist, "r2"),
  bindings: { CONTEXTFUL_D1_TOKEN: token },
});

const url = await mf.ready;
console.log(`URL=${url.origin}`);

async function stop() {
  await mf.dispose();
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
