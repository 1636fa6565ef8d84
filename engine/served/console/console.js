// The Contextful operator console (docs/console.md): status at a glance, and for an Admin the
// manifest's edit and apply, each mutation signed by this browser's console key.
//
// - Reading: GET /console/api/overview with the credential pasted at sign-in (kept in this tab's
//   sessionStorage only) as "Authorization: Bearer"; a reader sees status, an Admin also edits.
// - The console key: a non-extractable WebCrypto Ed25519 key pair made once and kept in IndexedDB;
//   its public key, ed25519:<base64url raw>, is what `contextful key issue --admin --console-key`
//   binds to the operator.
// - Operator attestation (surface.apply.operator-attestation): each POST to /control/draft and
//   /control/apply carries "Contextful-Attestation: v1;nonce=<32 hex>;iat=<unix s>;sig=<base64url>",
//   the signature over "contextful-console-v1\n<operator>\n<METHOD> <path>\n<sha256 hex of the
//   body>\n<nonce>\n<iat>\n", <operator> being the credential's on_behalf_of.
// - Charts are SVG drawn here (no library): rows landed per run over time, and the fire timeline.

const CREDENTIAL = "contextful.console.credential";
const KEY_DB = "contextful-console";
const KEY_STORE = "keys";
const KEY_NAME = "console";
const REFRESH_MS = 15000;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#1a5fb4", "#c64600", "#26734d", "#813d9c", "#a51d2d", "#0b7285", "#5e5c64", "#986a44"];

const state = { token: null, overview: null, keys: null, publicKey: null, base: null, draft: null, timer: null };
const $ = (id) => document.getElementById(id);

// --- small helpers ------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function when(text) {
  if (!text) return "—";
  const at = new Date(text);
  return Number.isNaN(at.getTime()) ? String(text) : at.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function count(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en");
}

function hex(bytes) {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");
}

function b64url(bytes) {
  let text = "";
  for (const b of new Uint8Array(bytes)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function say(text, error = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", error);
}

function fill(tbody, rows, columns, empty) {
  tbody.replaceChildren();
  if (!rows.length) {
    tbody.append(el("tr", {}, el("td", { colspan: columns, class: "empty" }, empty)));
    return;
  }
  for (const row of rows) tbody.append(row);
}

function failed(part) {
  return part && !Array.isArray(part) && part.error ? `${part.error}: ${part.detail}` : null;
}

// --- the console key ----------------------------------------------------------------------------

function keyDb() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(KEY_DB, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(KEY_STORE);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

function keyStep(db, mode, act) {
  return new Promise((resolve, reject) => {
    const request = act(db.transaction(KEY_STORE, mode).objectStore(KEY_STORE));
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

async function consoleKey() {
  const db = await keyDb();
  let pair = await keyStep(db, "readonly", (store) => store.get(KEY_NAME));
  if (!pair) {
    // non-extractable: the private key can sign here and never be read out
    pair = await crypto.subtle.generateKey({ name: "Ed25519" }, false, ["sign", "verify"]);
    await keyStep(db, "readwrite", (store) => store.put(pair, KEY_NAME));
  }
  db.close();
  const raw = await crypto.subtle.exportKey("raw", pair.publicKey);
  return { pair, text: "ed25519:" + b64url(raw) };
}

async function attestation(method, path, body) {
  if (!state.keys) throw new Error("this browser holds no console key, so it cannot sign a change");
  const nonce = hex(crypto.getRandomValues(new Uint8Array(16)));
  const iat = Math.floor(Date.now() / 1000);
  const digest = hex(await crypto.subtle.digest("SHA-256", body));
  const message = `contextful-console-v1\n${state.overview.holder.operator}\n${method} ${path}\n${digest}\n${nonce}\n${iat}\n`;
  const signature = await crypto.subtle.sign({ name: "Ed25519" }, state.keys.privateKey,
                                             new TextEncoder().encode(message));
  return `v1;nonce=${nonce};iat=${iat};sig=${b64url(signature)}`;
}

// --- requests -----------------------------------------------------------------------------------

async function call(method, path, fields) {
  const headers = { Authorization: `Bearer ${state.token}` };
  let body;
  if (fields !== undefined) {
    body = new TextEncoder().encode(JSON.stringify(fields));
    headers["Content-Type"] = "application/json";
    headers["Contextful-Attestation"] = await attestation(method, path, body);
  }
  const response = await fetch(path, { method, headers, body, cache: "no-store" });
  let doc = null;
  try {
    doc = await response.json();
  } catch {
    doc = { error: "AnswerUnreadable", detail: `${method} ${path} answered ${response.status} without JSON` };
  }
  return { status: response.status, doc };
}

// --- signing in ---------------------------------------------------------------------------------

async function signIn(token) {
  state.token = token;
  const ok = await refresh();
  if (ok) {
    sessionStorage.setItem(CREDENTIAL, token);
    $("main").focus();
  }
}

function signOut(message) {
  state.token = null;
  state.overview = null;
  sessionStorage.removeItem(CREDENTIAL);
  clearInterval(state.timer);
  state.timer = null;
  $("main").hidden = true;
  $("sign-in").hidden = false;
  $("sign-out").hidden = true;
  $("refresh").hidden = true;
  $("holder").textContent = "Not signed in";
  $("edit").hidden = true;
  $("edit-link").hidden = true;
  say(message || "", Boolean(message));
  $("credential").value = "";
  $("credential").focus();
}

async function refresh() {
  let answer;
  try {
    answer = await call("GET", "/console/api/overview");
  } catch (exc) {
    say(`The console could not reach serve: ${exc.message}`, true);
    return false;
  }
  if (answer.status === 401) {
    signOut(`Not signed in: ${answer.doc.error}: ${answer.doc.detail}`);
    return false;
  }
  if (answer.status !== 200) {
    say(`The overview failed: ${answer.doc.error}: ${answer.doc.detail}`, true);
    return false;
  }
  const first = state.overview === null;
  state.overview = answer.doc;
  render(answer.doc);
  if (first) {
    say("");
    if (answer.doc.holder.admin) await loadDocument();
    state.timer = setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }
  return true;
}

// --- the overview -------------------------------------------------------------------------------

function render(doc) {
  const holder = doc.holder;
  $("project").textContent = doc.project ? `· ${doc.project}` : "";
  $("holder").replaceChildren(
    "Signed in as ", el("strong", {}, holder.operator), " ",
    holder.admin ? el("span", { class: "role admin" }, "Admin: edits and applies")
                 : el("span", { class: "role reader" }, "reader: status only"));
  $("sign-in").hidden = true;
  $("main").hidden = false;
  $("sign-out").hidden = false;
  $("refresh").hidden = false;
  $("edit").hidden = !holder.admin;
  $("edit-link").hidden = !holder.admin;
  renderKeyMatch();
  renderApplied(doc.applied);
  renderPipelines(doc.pipelines);
  renderRuns(doc.runs);
  renderDerive(doc.derive);
  renderModels(doc.models);
  renderExports(doc.exports);
  drawRows(Array.isArray(doc.runs) ? doc.runs : []);
  drawFires(Array.isArray(doc.pipelines) ? doc.pipelines : [], Array.isArray(doc.runs) ? doc.runs : [], doc.now);
}

function renderKeyMatch() {
  const note = $("key-match");
  const holder = state.overview && state.overview.holder;
  note.classList.remove("warn");
  if (!holder || !holder.admin) {
    note.textContent = "";
  } else if (!holder.console_key) {
    note.textContent = "Your Admin credential binds no console key: the served face refuses its changes. "
      + "Ask for one issued with --console-key and the key above.";
    note.classList.add("warn");
  } else if (holder.console_key !== state.publicKey) {
    note.textContent = "Your Admin credential binds another console key than this browser's: the served face "
      + "refuses changes signed here.";
    note.classList.add("warn");
  } else {
    note.textContent = "Your Admin credential binds this browser's key: changes you make here are signed as yours.";
  }
}

function renderApplied(applied) {
  const list = $("applied");
  list.replaceChildren();
  const pair = (name, value) => list.append(el("dt", {}, name), el("dd", {}, value));
  const problem = failed(applied);
  if (problem) return pair("Error", problem);
  if (applied.version === null) return pair("Version", "none applied yet (contextful pipeline import claims v1)");
  pair("Version", el("strong", { id: "applied-version" }, `v${applied.version}`));
  pair("Claimed", when(applied.claimed_at));
  const receipt = applied.receipt;
  if (!receipt) {
    pair("Receipt", "none: a local claim signs no receipt (a synced one does)");
    return;
  }
  pair("Receipt digest", el("code", {}, receipt.digest));
  pair("Signed by", el("code", {}, receipt.signer));
  pair("Predecessor", receipt.parent === "-" ? "none (the first version)" : el("code", {}, receipt.parent));
  pair("Snapshot SHA-256", el("code", {}, receipt.snapshot));
}

function armedText(p) {
  if (p.armed) return p.in_flight ? "armed, in flight" : "armed";
  if (p.unit) return `runs with ${p.unit}`;
  return p.unarmed ? `not armed: ${p.unarmed}` : "not armed";
}

function outcomeCell(outcome) {
  if (!outcome) return el("td", { class: "empty" }, "no run yet");
  const failure = outcome.failure ? `: ${outcome.failure.error}: ${outcome.failure.detail}` : "";
  const rows = outcome.rows !== null && outcome.rows !== undefined ? `, ${count(outcome.rows)} rows` : "";
  return el("td", { class: outcome.status }, `${outcome.status}${rows} at ${when(outcome.at)}${failure}`);
}

function renderPipelines(pipelines) {
  const problem = failed(pipelines);
  const rows = problem ? [] : pipelines.map((p) => el("tr", {},
    el("th", { scope: "row" }, p.id, p.table && p.table !== p.id ? el("span", { class: "note" }, ` → ${p.table}`) : null),
    el("td", {}, p.source),
    el("td", {}, p.schedule ? el("code", {}, p.schedule) : "—"),
    el("td", { class: p.armed ? "ok" : "" }, armedText(p)),
    el("td", {}, when(p.last_fire)),
    el("td", {}, when(p.next_fire)),
    outcomeCell(p.last_outcome)));
  fill($("pipelines").tBodies[0], rows, 7, problem || "The applied version declares no pipeline.");
}

function renderRuns(runs) {
  const problem = failed(runs);
  const rows = problem ? [] : runs.slice().reverse().map((r) => el("tr", {},
    el("th", { scope: "row" }, el("code", {}, r.run_id)),
    el("td", {}, r.table),
    el("td", { class: r.status }, r.failure ? `${r.status}: ${r.failure.error}` : r.status),
    el("td", {}, when(r.recorded_at)),
    el("td", { class: "num" }, count(r.rows)),
    el("td", { class: "num" }, count(r.bytes)),
    el("td", {}, r.events.length ? el("ul", {}, r.events.map((e) => el("li", {}, e))) : "none")));
  fill($("runs").tBodies[0], rows, 7, problem || "No run yet.");
}

function renderDerive(derive) {
  const problem = failed(derive);
  const rows = problem ? [] : derive.map((d) => el("tr", {},
    el("th", { scope: "row" }, d.pipeline),
    el("td", { class: "num" }, count(d.eligible)), el("td", { class: "num" }, count(d.derived)),
    el("td", { class: "num" }, count(d.outstanding)), el("td", { class: "num" }, count(d.retiring))));
  fill($("derive").tBodies[0], rows, 5, problem || "No derive pipeline.");
}

function renderModels(models) {
  const problem = failed(models);
  const rows = problem ? [] : models.map((m) => el("tr", {},
    el("th", { scope: "row" }, m.model),
    el("td", {}, m.build_id === null ? "no build published" : `build ${m.build_id}`),
    el("td", { class: m.stale ? "bad" : "ok" }, m.stale ? "stale" : "current"),
    el("td", {}, m.why && m.why.length ? m.why.join("; ") : "—")));
  fill($("models").tBodies[0], rows, 4, problem || "No model.");
}

function renderExports(exports) {
  const problem = failed(exports);
  const source = (s) => !s ? "unknown" : s.kind === "model" ? `model ${s.name} build ${s.build_id}`
                                                           : `table ${s.name} at commit_seq ${s.commit_seq}`;
  const rows = problem ? [] : exports.map((x) => el("tr", {},
    el("th", { scope: "row" }, x.export),
    el("td", {}, el("code", {}, x.identifier)),
    el("td", {}, x.snapshot_id === null ? "none yet" : String(x.snapshot_id)),
    el("td", {}, x.snapshot_id === null ? "—" : source(x.source)),
    el("td", { class: "num" }, count(x.rows))));
  fill($("exports").tBodies[0], rows, 5, problem || "No export.");
}

// --- charts -------------------------------------------------------------------------------------

const W = 520;
const PAD = { left: 60, right: 14, top: 14, bottom: 30 };

function timeTicks(box, x, lo, hi, y) {
  // first and last labels kept inside the plot; a span of seconds shows only its two ends
  const n = hi - lo < 10e3 ? 1 : 3;
  for (let i = 0; i <= n; i += 1) {
    const t = lo + ((hi - lo) * i) / n;
    const anchor = i === 0 ? "start" : i === n ? "end" : "middle";
    box.append(svg("text", { x: x(t), y, "text-anchor": anchor }, shortTime(t, hi - lo)));
  }
}

function shortTime(ms, span) {
  const iso = new Date(ms).toISOString();
  return span > 36 * 3600e3 ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, 19);
}

function chart(target, height, label, draw) {
  const box = svg("svg", { viewBox: `0 0 ${W} ${height}`, role: "img", "aria-label": label });
  draw(box);
  $(target).replaceChildren(box);
}

function emptyChart(target, text) {
  chart(target, 60, text, (box) => box.append(svg("text", { x: 12, y: 34 }, text)));
}

function legendRows(names) {
  // the legend above the plot, wrapped into rows: where each name's swatch goes
  const at = [];
  let lx = PAD.left;
  let row = 0;
  for (const name of names) {
    const width = 24 + 7 * Math.min(name.length, 24);
    if (lx + width > W - PAD.right && lx > PAD.left) { row += 1; lx = PAD.left; }
    at.push([lx, PAD.top - 8 + row * 16]);
    lx += width;
  }
  return { at, rows: row + 1 };
}

function drawRows(runs) {
  const points = runs.filter((r) => r.status === "committed" && r.rows !== null)
    .map((r) => ({ t: Date.parse(r.recorded_at), rows: r.rows, table: r.table, id: r.run_id }))
    .filter((p) => !Number.isNaN(p.t));
  if (!points.length) return emptyChart("rows-chart", "No committed run yet: nothing to draw.");
  const tables = [...new Set(points.map((p) => p.table))];
  const legend = legendRows(tables);
  const top0 = PAD.top + legend.rows * 16;
  const H = 240 + legend.rows * 16;
  let lo = Math.min(...points.map((p) => p.t));
  let hi = Math.max(...points.map((p) => p.t));
  if (hi === lo) { lo -= 60e3; hi += 60e3; }
  const top = Math.max(1, ...points.map((p) => p.rows));
  const x = (t) => PAD.left + ((t - lo) / (hi - lo)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / top) * (H - top0 - PAD.bottom);
  const total = points.reduce((sum, p) => sum + p.rows, 0);
  chart("rows-chart", H, `Rows landed per run: ${points.length} committed runs of ${tables.length} tables, ` +
        `${total.toLocaleString("en")} rows in all, at most ${top.toLocaleString("en")} in one run`, (box) => {
    for (const v of new Set([0, Math.round(top / 2), top])) {
      box.append(svg("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v) }),
                 svg("text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, Math.round(v).toLocaleString("en")));
    }
    box.append(svg("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }));
    timeTicks(box, x, lo, hi, H - PAD.bottom + 16);
    tables.forEach((table, i) => {
      const color = PALETTE[i % PALETTE.length];
      const mine = points.filter((p) => p.table === table);
      box.append(svg("polyline", { fill: "none", stroke: color, "stroke-width": 2,
                                   points: mine.map((p) => `${x(p.t)},${y(p.rows)}`).join(" ") }));
      for (const p of mine) {
        box.append(svg("circle", { cx: x(p.t), cy: y(p.rows), r: 4, fill: color },
                       svg("title", {}, `${table}, run ${p.id}: ${p.rows.toLocaleString("en")} rows at ${when(p.t)}`)));
      }
      const [lx, ly] = legend.at[i];
      box.append(svg("rect", { x: lx, y: ly, width: 10, height: 10, fill: color }),
                 svg("text", { x: lx + 14, y: ly + 9 }, table));
    });
  });
}

function drawFires(pipelines, runs, now) {
  const lanes = pipelines.filter((p) => p.table || p.last_fire || p.next_fire);
  const byTable = (p) => runs.filter((r) => r.table === p.table)
    .map((r) => ({ t: Date.parse(r.recorded_at), status: r.status, id: r.run_id }))
    .filter((r) => !Number.isNaN(r.t));
  const nowMs = now ? Date.parse(now) : Date.now();
  const times = [nowMs];
  for (const p of lanes) {
    for (const r of byTable(p)) times.push(r.t);
    for (const t of [p.last_fire, p.next_fire]) if (t) times.push(Date.parse(t));
  }
  if (!lanes.length) return emptyChart("fires-chart", "No pipeline: nothing to draw.");
  let lo = Math.min(...times);
  let hi = Math.max(...times);
  if (hi === lo) { lo -= 60e3; hi += 60e3; }
  const span = hi - lo;
  lo -= span * 0.03;
  hi += span * 0.03;
  const lane = 26;
  const H = PAD.top + lanes.length * lane + PAD.bottom;
  const left = 110;
  const x = (t) => left + ((t - lo) / (hi - lo)) * (W - left - PAD.right);
  const armed = lanes.filter((p) => p.next_fire).length;
  chart("fires-chart", H, `Fire timeline of ${lanes.length} pipelines, ${armed} with a next fire`, (box) => {
    lanes.forEach((p, i) => {
      const mid = PAD.top + i * lane + lane / 2;
      box.append(svg("line", { class: "grid", x1: left, x2: W - PAD.right, y1: mid, y2: mid }),
                 svg("text", { x: left - 6, y: mid + 4, "text-anchor": "end" }, p.id.length > 16 ? p.id.slice(0, 15) + "…" : p.id));
      for (const r of byTable(p)) {
        const color = r.status === "committed" ? "#26734d" : r.status === "failed" ? "#b3261e" : "#5e5c64";
        box.append(svg("circle", { cx: x(r.t), cy: mid, r: 4.5, fill: color },
                       svg("title", {}, `${p.id}: run ${r.id} ${r.status} at ${when(r.t)}`)));
      }
      if (p.last_fire) {
        const t = x(Date.parse(p.last_fire));
        box.append(svg("line", { x1: t, x2: t, y1: mid - 9, y2: mid + 9, stroke: "#1a5fb4", "stroke-width": 2 },
                       svg("title", {}, `${p.id}: last fire ${when(p.last_fire)}`)));
      }
      if (p.next_fire) {
        const t = x(Date.parse(p.next_fire));
        box.append(svg("path", { d: `M${t} ${mid - 7} L${t + 7} ${mid} L${t} ${mid + 7} L${t - 7} ${mid} Z`,
                                 fill: "#fff", stroke: "#1a5fb4", "stroke-width": 2 },
                       svg("title", {}, `${p.id}: next fire ${when(p.next_fire)}`)));
      }
    });
    const bottom = H - PAD.bottom;
    box.append(svg("line", { class: "axis", x1: left, x2: W - PAD.right, y1: bottom, y2: bottom }),
               svg("line", { class: "now", x1: x(nowMs), x2: x(nowMs), y1: PAD.top, y2: bottom },
                   svg("title", {}, `now: ${when(nowMs)}`)));
    timeTicks(box, x, lo, hi, bottom + 16);
  });
}

// --- editing ------------------------------------------------------------------------------------

function showProblems(problems) {
  const box = $("problems");
  const list = $("problem-list");
  list.replaceChildren(...problems.map((p) => el("li", {}, el("strong", {}, p.error), ": ", p.detail)));
  box.hidden = problems.length === 0;
}

function setDraft(draft) {
  state.draft = draft;
  $("apply-draft").disabled = !draft;
}

async function loadDocument() {
  const answer = await call("GET", "/control/document");
  if (answer.status !== 200) {
    say(`The document could not be read: ${answer.doc.error}: ${answer.doc.detail}`, true);
    return;
  }
  const doc = answer.doc;
  state.base = doc.version;
  $("base-version").textContent = doc.version === null ? "no applied version" : `v${doc.version}`;
  showProblems([]);
  const draft = doc.draft;
  if (draft && draft.version === doc.version) {
    $("document").value = draft.document;
    setDraft({ id: draft.id, version: draft.version });
    $("draft-state").textContent = `A draft saved by ${draft.operator} at ${when(draft.saved_at)} is loaded, based on ` +
      `v${draft.version}: apply it, or edit and save again.`;
  } else {
    $("document").value = doc.document;
    setDraft(null);
    $("draft-state").textContent = draft ? `The saved draft was based on v${draft.version}, no longer applied: ` +
      "the applied document is loaded." : "No draft: the applied document is loaded.";
  }
}

async function saveDraft(event) {
  event.preventDefault();
  if (state.base === null) {
    say("Nothing is applied yet: contextful pipeline import claims v1 first.", true);
    return;
  }
  setDraft(null);
  say("Validating the draft…");
  let answer;
  try {
    answer = await call("POST", "/control/draft", { document: $("document").value, version: state.base });
  } catch (exc) {
    say(`The draft was not saved: ${exc.message}`, true);
    return;
  }
  const doc = answer.doc;
  if (answer.status === 200) {
    showProblems([]);
    setDraft({ id: doc.draft, version: doc.version });
    $("draft-state").textContent = `Draft ${doc.draft} saved by ${doc.operator}, based on v${doc.version}.`;
    say(`The draft is valid and saved: apply it to claim v${doc.version + 1}.`);
    $("apply-draft").focus();
    return;
  }
  if (Array.isArray(doc.problems)) {
    showProblems(doc.problems);
    say(`The draft was not saved: ${doc.problems.length} validation problem(s).`, true);
    return;
  }
  showProblems([{ error: doc.error, detail: doc.detail || "" }]);
  say(`The draft was not saved: ${doc.error}.`, true);
}

async function applyDraft() {
  if (!state.draft) return;
  say("Applying the draft…");
  let answer;
  try {
    answer = await call("POST", "/control/apply", { draft: state.draft.id });
  } catch (exc) {
    say(`Nothing was applied: ${exc.message}`, true);
    return;
  }
  const doc = answer.doc;
  if (answer.status !== 200) {
    showProblems(Array.isArray(doc.problems) ? doc.problems : [{ error: doc.error, detail: doc.detail || "" }]);
    say(`Nothing was applied: ${doc.error}.`, true);
    return;
  }
  setDraft(null);
  await refresh();
  await loadDocument();
  say(`Applied v${doc.version} (v${doc.previous} before); serve arms it at its next look.`);
}

// --- start --------------------------------------------------------------------------------------

async function start() {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("credential").value.trim());
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("refresh").addEventListener("click", () => refresh());
  $("edit-form").addEventListener("submit", saveDraft);
  $("apply-draft").addEventListener("click", applyDraft);
  $("reload-document").addEventListener("click", () => loadDocument());
  $("document").addEventListener("input", () => {
    if (state.draft) {
      setDraft(null);
      $("draft-state").textContent = "Edited since the draft was saved: save it again to apply.";
    }
  });
  try {
    const found = await consoleKey();
    state.keys = found.pair;
    state.publicKey = found.text;
    $("console-public-key").textContent = found.text;
  } catch (exc) {
    $("console-public-key").textContent = `No console key: this browser's WebCrypto cannot make an Ed25519 key ` +
      `(${exc.name || exc.message}), so it can read status but sign no change.`;
  }
  const kept = sessionStorage.getItem(CREDENTIAL);
  if (kept) await signIn(kept);
  document.body.dataset.ready = "true";
}

start();
