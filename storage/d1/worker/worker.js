/**
 * The D1 profile's private Worker (CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1, docs/store.md "The D1 profile").
 *
 * Implements the binding side of run.journal.d1-profile and run.journal.d1-blob (decisions
 * "d1-execution-state" and "run-substrate-storage"): the Python adapters (storage/d1/client.py and
 * storage/<port>/d1.py) reach D1 and R2 only through this Worker, and it exposes exactly what they need:
 *
 *   POST   /d1/batch            {"statements": [{"sql": "...", "params": [...]}, ...]}
 *                               -> {"results": [{"columns": [...], "rows": [[...]], "changes": n}, ...]}
 *                               One D1 batch: one transaction, ended with this request (D1 has no
 *                               interactive transaction, so a compare-and-swap lives in the statements).
 *                               D1 answers a batch's rows as objects: a statement's result columns must
 *                               have distinct names (alias a repeated one).
 *   GET    /r2/object/<key>     the object's bytes (etag header), 404 when absent
 *   HEAD   /r2/object/<key>     its etag and size, 404 when absent
 *   PUT    /r2/object/<key>     store the body; "x-only-if: absent" or "x-only-if: etag=<etag>" makes the
 *                               put conditional: 412 when the condition fails, nothing written
 *   DELETE /r2/object/<key>     delete (absent: no error)
 *   GET    /r2/list?prefix=&cursor=   {"objects": [{"key", "size", "etag"}], "cursor", "truncated"}
 *
 * Every request carries "authorization: Bearer <token>" equal to the CONTEXTFUL_D1_TOKEN secret (the
 * private binding: only the adapters hold it); anything else answers 401 and touches nothing.
 * Bytes travel in JSON as {"$b64": "<base64>"}: a parameter so encoded binds as a BLOB, and a BLOB
 * column answers so encoded. Errors answer JSON {"error": "<what>", "operation": "<which>"}.
 */

const BLOB = "$b64";

export default {
  async fetch(request, env) {
    if (!(await authorized(request, env))) {
      return failure(401, "missing or wrong bearer token", "auth");
    }
    const url = new URL(request.url);
    try {
      if (url.pathname === "/d1/batch" && request.method === "POST") {
        return await d1Batch(request, env);
      }
      if (url.pathname === "/r2/list" && request.method === "GET") {
        return await r2List(url, env);
      }
      if (url.pathname.startsWith("/r2/object/")) {
        const key = decodeURIComponent(url.pathname.slice("/r2/object/".length));
        return await r2Object(request, env, key);
      }
      return failure(404, `no route ${request.method} ${url.pathname}`, "route");
    } catch (err) {
      return failure(500, String(err && err.message ? err.message : err), operationOf(request, url));
    }
  },
};

async function authorized(request, env) {
  const expected = env.CONTEXTFUL_D1_TOKEN;
  const header = request.headers.get("authorization") || "";
  if (!expected || !header.startsWith("Bearer ")) {
    return false;
  }
  const offered = new TextEncoder().encode(header.slice("Bearer ".length));
  const wanted = new TextEncoder().encode(expected);
  return offered.byteLength === wanted.byteLength && crypto.subtle.timingSafeEqual(offered, wanted);
}

function operationOf(request, url) {
  return `${request.method} ${url.pathname.startsWith("/r2/object/") ? "/r2/object" : url.pathname}`;
}

function failure(status, error, operation) {
  return Response.json({ error, operation }, { status });
}

// --- D1 ------------------------------------------------------------------------------------------

async function d1Batch(request, env) {
  const body = await request.json();
  if (!Array.isArray(body.statements) || body.statements.length === 0) {
    return failure(400, "a batch needs a non-empty statements list", "d1 batch");
  }
  const prepared = body.statements.map((s) => env.DB.prepare(s.sql).bind(...(s.params || []).map(fromJson)));
  let answers;
  try {
    answers = await env.DB.batch(prepared);
  } catch (err) {
    // a statement D1 refused (syntax, constraint): the whole batch rolled back
    return failure(422, String(err && err.message ? err.message : err), "d1 batch");
  }
  return Response.json({ results: answers.map(resultJson) });
}

function resultJson(answer) {
  const rows = answer.results || [];
  const columns = rows.length ? Object.keys(rows[0]) : [];
  return {
    columns,
    rows: rows.map((row) => columns.map((c) => toJson(row[c]))),
    changes: (answer.meta && answer.meta.changes) || 0,
  };
}

function fromJson(value) {
  if (value !== null && typeof value === "object" && BLOB in value) {
    return Uint8Array.from(atob(value[BLOB]), (c) => c.charCodeAt(0)).buffer;
  }
  return value;
}

function toJson(value) {
  if (value instanceof ArrayBuffer || ArrayBuffer.isView(value) || Array.isArray(value)) {
    const bytes = Array.isArray(value) ? Uint8Array.from(value) : new Uint8Array(value.buffer || value);
    let text = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    }
    return { [BLOB]: btoa(text) };
  }
  return value;
}

// --- R2 ------------------------------------------------------------------------------------------

async function r2Object(request, env, key) {
  if (request.method === "GET") {
    const object = await env.BUCKET.get(key);
    if (object === null) {
      return failure(404, `no object ${key}`, "r2 get");
    }
    return new Response(object.body, { headers: { etag: object.etag, "content-type": "application/octet-stream" } });
  }
  if (request.method === "HEAD") {
    const object = await env.BUCKET.head(key);
    if (object === null) {
      return new Response(null, { status: 404 });
    }
    return new Response(null, { headers: { etag: object.etag, "x-size": String(object.size) } });
  }
  if (request.method === "PUT") {
    return r2Put(request, env, key);
  }
  if (request.method === "DELETE") {
    await env.BUCKET.delete(key);
    return new Response(null, { status: 204 });
  }
  return failure(405, `no method ${request.method} on an object`, "r2 object");
}

async function r2Put(request, env, key) {
  const condition = request.headers.get("x-only-if");
  const options = {};
  if (condition === "absent") {
    options.onlyIf = { etagDoesNotMatch: "*" };
  } else if (condition && condition.startsWith("etag=")) {
    options.onlyIf = { etagMatches: condition.slice("etag=".length) };
  } else if (condition) {
    return failure(400, `unknown condition ${condition}`, "r2 put");
  }
  const body = await request.arrayBuffer();
  const object = await env.BUCKET.put(key, body, options);
  if (object === null) {
    return failure(412, `the condition ${condition} does not hold for ${key}`, "r2 put");
  }
  return Response.json({ etag: object.etag, size: object.size });
}

async function r2List(url, env) {
  const options = { prefix: url.searchParams.get("prefix") || "", limit: 1000 };
  const cursor = url.searchParams.get("cursor");
  if (cursor) {
    options.cursor = cursor;
  }
  const listed = await env.BUCKET.list(options);
  return Response.json({
    objects: listed.objects.map((o) => ({ key: o.key, size: o.size, etag: o.etag })),
    cursor: listed.truncated ? listed.cursor : null,
    truncated: listed.truncated,
  });
}
