// The peer of benchmarks/http_bench.py's actor on Cloudflare's runtime: a Durable Object with
// SQLite storage per key, behind the same routes (`POST /actors/bench/actions/ACTION?key=K`), so
// the same load client drives both. `bump` changes one stored value; `bump_sql` inserts a row and
// changes the value, both in the object's one implicit transaction (output-gated, as on
// Cloudflare).
import { DurableObject } from "cloudflare:workers";

export class Bench extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v INTEGER)");
  }
  async bump() {
    const n = (this.ctx.storage.kv.get("n") ?? 0) + 1;
    this.ctx.storage.kv.put("n", n);
    return n;
  }
  async bump_sql() {
    const n = (this.ctx.storage.kv.get("n") ?? 0);
    this.ctx.storage.sql.exec("INSERT INTO t(v) VALUES (?)", n);
    this.ctx.storage.kv.put("n", n + 1);
    return n + 1;
  }
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const m = url.pathname.match(/^\/actors\/bench\/actions\/(\w+)$/);
    if (!m || request.method !== "POST") return new Response("not found", { status: 404 });
    const key = url.searchParams.get("key");
    const stub = env.BENCH.get(env.BENCH.idFromName(key));
    const result = await stub[m[1]]();
    return Response.json({ result });
  },
};
