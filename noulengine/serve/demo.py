"""The demo page served at ``GET /``: type a state, add questions, attach images, see bars.

Self-contained HTML + JS (no external assets, nothing fetched but this server's ``/v1/limits`` and
``/v1/decide``; the question cap shown and enforced by the add buttons is read from ``/v1/limits``);
images are read in the browser and sent as base64 ``{"type", "data"}`` objects.
"""

from __future__ import annotations

DEMO_HTML = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>noulengine demo</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:15px/1.4 system-ui,sans-serif;max-width:860px;margin:2em auto;padding:0 1em;color:#222}
 textarea,input,select{font:inherit;box-sizing:border-box} textarea{width:100%}
 fieldset{border:1px solid #ccc;border-radius:6px;margin:.6em 0;padding:.6em}
 .row{display:flex;gap:.5em;align-items:center;margin:.3em 0} .row input[type=text]{flex:1}
 .bar-row{display:flex;align-items:center;gap:.5em;margin:2px 0}
 .bar-row .name{width:12em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
 .track{flex:1;background:#eee;border-radius:3px;height:14px}
 .fill{background:#3a7bd5;height:14px;border-radius:3px}
 .p{width:4.5em;text-align:right;font-variant-numeric:tabular-nums}
 #error{color:#b00020;white-space:pre-wrap} button{font:inherit;padding:.3em .8em}
</style></head><body>
<h1>noulengine</h1>
<p>Evidence in, probabilities out: every question is answered in one forward pass.</p>
<label>State (text or JSON)<br><textarea id="state" rows="5">The server rejected 3 logins from a new country.</textarea></label>
<div class="row"><label>Images <input id="images" type="file" accept="image/png,image/jpeg,image/webp,image/gif" multiple></label></div>
<div class="row"><label>API key (if the server needs one) <input id="apikey" type="password" autocomplete="off"></label></div>
<div id="questions"></div>
<div class="row">
 <button type="button" data-add="noul">+ yes/no</button>
 <button type="button" data-add="choice">+ choice</button>
 <button type="button" data-add="score">+ score</button>
 <span style="flex:1"></span><button type="button" id="submit">Decide</button>
</div>
<div class="row"><small id="cap"></small></div>
<div id="error" role="alert"></div>
<div id="answers" aria-live="polite"></div>
<script>
"use strict";
let qCount = 0, maxQuestions = null;
function questionCount() { return document.querySelectorAll("#questions .question").length; }
function updateCap() {
  const full = maxQuestions !== null && questionCount() >= maxQuestions;
  for (const b of document.querySelectorAll("[data-add]")) b.disabled = full;
  document.getElementById("cap").textContent = maxQuestions === null ? "" :
    `${questionCount()} of at most ${maxQuestions} questions per request on this server`;
}
async function loadLimits() {
  try {
    const r = await fetch("/v1/limits");
    if (r.ok) { const cap = (await r.json()).max_questions["/v1/decide"]; maxQuestions = cap === null ? null : cap; }
  } catch (e) { /* the server refuses over-cap requests itself */ }
  updateCap();
}
const HINT = {noul: "(optional) one line 'true: ...' and/or 'false: ...'",
  choice: "one option per line: name: description", score: "one level per line, lowest first"};
function addQuestion(type, id, instructions, criteria) {
  qCount += 1;
  const fs = document.createElement("fieldset");
  fs.className = "question"; fs.dataset.type = type;
  fs.innerHTML = `<div class="row"><b>${type === "noul" ? "yes/no" : type}</b><input type="text" class="qid" placeholder="id">
    <button type="button" class="remove">remove</button></div>
    <input type="text" class="instructions" placeholder="instructions" style="width:100%">
    <textarea class="criteria" rows="3" placeholder="${HINT[type]}"></textarea>`;
  fs.querySelector(".qid").value = id || `${type}${qCount}`;
  fs.querySelector(".instructions").value = instructions || "";
  fs.querySelector(".criteria").value = criteria || "";
  fs.querySelector(".remove").onclick = () => { fs.remove(); updateCap(); };
  document.getElementById("questions").appendChild(fs);
  updateCap();
}
function parseCriteria(type, text) {
  const lines = text.split("\n").map(s => s.trim()).filter(Boolean);
  if (type === "score") return lines;
  const out = {};
  for (const line of lines) {
    const i = line.indexOf(":");
    const k = (i < 0 ? line : line.slice(0, i)).trim();
    const v = i < 0 ? null : line.slice(i + 1).trim() || null;
    if (type === "noul") { if (k === "true" || k === "false") out[k] = v; } else out[k] = v;
  }
  return type === "noul" && !Object.keys(out).length ? undefined : out;
}
function readImage(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve({type: file.type, data: String(r.result).split(",", 2)[1]});
    r.onerror = () => reject(r.error); r.readAsDataURL(file);
  });
}
function buildState(text) { try { return JSON.parse(text); } catch (e) { return text; } }
function bar(name, p, shown) {
  const row = document.createElement("div"); row.className = "bar-row"; row.dataset.label = name;
  row.innerHTML = `<span class="name"></span><span class="track"><span class="fill" style="display:block;width:${(100 * p).toFixed(1)}%"></span></span><span class="p">${p.toFixed(3)}</span>`;
  row.querySelector(".name").textContent = shown || name; return row;
}
function render(result) {
  const box = document.getElementById("answers"); box.innerHTML = "";
  for (const [field, a] of Object.entries(result.answers)) {
    const div = document.createElement("div"); div.className = "answer"; div.dataset.field = field;
    const h = document.createElement("h3");
    const texts = a.level_texts || {};
    const named = k => (texts[k] ? `${k} (${texts[k]})` : k);
    h.textContent = `${field}: ${named(a.label)} (confidence ${a.confidence.toFixed(3)})`;
    div.appendChild(h);
    for (const [name, p] of Object.entries(a.probabilities)) div.appendChild(bar(name, p, named(name)));
    box.appendChild(div);
  }
  box.dataset.done = "1";
}
async function submit() {
  const err = document.getElementById("error"); err.textContent = "";
  document.getElementById("answers").dataset.done = "";
  const questions = {};
  for (const fs of document.querySelectorAll("#questions .question")) {
    const type = fs.dataset.type, q = {type, instructions: fs.querySelector(".instructions").value};
    const c = parseCriteria(type, fs.querySelector(".criteria").value);
    if (c !== undefined) q.criteria = c;
    questions[fs.querySelector(".qid").value] = q;
  }
  const images = await Promise.all([...document.getElementById("images").files].map(readImage));
  const body = {state: buildState(document.getElementById("state").value), questions};
  if (images.length) body.images = images;
  const headers = {"Content-Type": "application/json"};
  const key = document.getElementById("apikey").value; if (key) headers.Authorization = "Bearer " + key;
  try {
    const r = await fetch("/v1/decide", {method: "POST", headers, body: JSON.stringify(body)});
    const data = await r.json();
    if (!r.ok) {
      const d = data.detail;
      err.textContent = `${r.status}: ` + (Array.isArray(d) ? d.map(x => `${x.loc.join(".")}: ${x.msg}`).join("\n") : (d && d.message) || JSON.stringify(d));
      document.getElementById("answers").dataset.done = "error"; return;
    }
    render(data);
  } catch (e) { err.textContent = String(e); document.getElementById("answers").dataset.done = "error"; }
}
for (const b of document.querySelectorAll("[data-add]")) b.onclick = () => addQuestion(b.dataset.add);
document.getElementById("submit").onclick = submit;
addQuestion("noul", "flag", "Should a human look at it?", "");
addQuestion("choice", "topic", "Which topic?", "world: World news.\nbusiness\nsports");
addQuestion("score", "risk", "How risky?", "none\nlow\nhigh");
loadLimits();
</script></body></html>
"""
