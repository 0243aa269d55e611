// `node server.mjs PORT`: the peer of benchmarks/http_bench.py's actor on RivetKit 2.3.19, its
// engine started locally by `registry.start()` (the binary from npm, on its default port 6420),
// behind pagekv's route (`POST /actors/bench/actions/ACTION?key=K`), which calls the actor through
// RivetKit's own client as an application would; prints `listening URL` once an actor answers.
import http from "node:http";
import { actor, setup } from "rivetkit";
import { createClient } from "rivetkit/client";

const bench = actor({
  state: { n: 0 },
  actions: {
    bump: (c) => ++c.state.n,
  },
});
export const registry = setup({ use: { bench } });
registry.start();
const client = createClient({ endpoint: "http://127.0.0.1:6420" });
const port = Number(process.argv[2]);
// the engine answers before it can route to the actors: call until it can
for (let tries = 0; ; tries++) {
  try {
    await client.bench.getOrCreate(["warm-up"]).bump();
    break;
  } catch (e) {
    if (tries >= 20) throw e;
    await new Promise((done) => setTimeout(done, 1000));
  }
}
http
  .createServer(async (req, res) => {
    const url = new URL(req.url, "http://localhost");
    const m = url.pathname.match(/^\/actors\/bench\/actions\/(\w+)$/);
    req.resume();
    if (!m || req.method !== "POST") {
      res.writeHead(404, { "content-length": 0 });
      res.end();
      return;
    }
    try {
      const result = await client.bench.getOrCreate([url.searchParams.get("key")])[m[1]]();
      const body = JSON.stringify({ result });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
      res.end(body);
    } catch (e) {
      const body = String(e);
      res.writeHead(500, { "content-length": Buffer.byteLength(body) });
      res.end(body);
    }
  })
  .listen(port, "127.0.0.1", () => console.log(`listening http://127.0.0.1:${port}`));
process.on("SIGTERM", () => process.exit(0));
process.on("SIGINT", () => process.exit(0));
