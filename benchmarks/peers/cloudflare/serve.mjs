// `node serve.mjs PORT DIR`: serve worker.mjs in miniflare on 127.0.0.1:PORT, its Durable Objects'
// SQLite files in DIR; prints `listening URL` once ready, and stops on SIGINT or SIGTERM.
import { Miniflare } from "miniflare";
const [port, dir] = process.argv.slice(2);
const mf = new Miniflare({
  modules: true,
  scriptPath: new URL("./worker.mjs", import.meta.url).pathname,
  compatibilityDate: "2025-04-01",
  durableObjects: { BENCH: { className: "Bench", useSQLite: true } },
  durableObjectsPersist: dir,
  port: Number(port),
  host: "127.0.0.1",
});
const url = await mf.ready;
console.log(`listening ${url}`);
process.on("SIGINT", async () => { await mf.dispose(); process.exit(0); });
process.on("SIGTERM", async () => { await mf.dispose(); process.exit(0); });
