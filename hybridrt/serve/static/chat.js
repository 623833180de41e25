// The chat page of `hybridrt serve`: streams replies from this server's /v1/chat/completions
// (server-sent events read off fetch's ReadableStream) and keeps the conversation in memory.
"use strict";

const $ = (id) => document.getElementById(id);
const els = {
  key: $("api-key"), maxTokens: $("max-tokens"), temperature: $("temperature"), clear: $("clear"),
  log: $("log"), form: $("composer"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
  status: $("status"), model: $("model"),
};
const STORE = { key: "hybridrt.apiKey", maxTokens: "hybridrt.maxTokens", temperature: "hybridrt.temperature" };

// "required" when this server wants an API key (page.py): without one, no call is made that
// the server would refuse.
const KEY_REQUIRED = document.querySelector('meta[name="hybridrt-api-key"]')?.content === "required";

// True, with the hint shown in `where` and Settings opened, when the server wants a key and none is set.
function keyMissing(where) {
  if (!KEY_REQUIRED || els.key.value.trim()) return false;
  where.textContent = "Set the API key in Settings.";
  $("settings").open = true;
  return true;
}

const messages = []; // {role, content} of the finished turns, sent with each request
let controller = null; // the reply in flight, if any

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = els.key.value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function apiError(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

function addMessage(role, text) {
  const li = document.createElement("li");
  li.className = `msg ${role}`;
  const who = document.createElement("p");
  who.className = "role";
  who.textContent = role === "user" ? "You" : role === "assistant" ? "Model" : "Error";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  li.append(who, content);
  els.log.append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

function setBusy(busy) {
  els.send.disabled = busy;
  els.stop.disabled = !busy;
  els.form.setAttribute("aria-busy", String(busy));
}

// Yields the payload of each `data:` line of an event stream.
async function* events(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) {
      if (line.startsWith("data:")) yield line.slice(5).trim();
    }
  }
}

function stats(tokens, started, first, ended) {
  const ttft = first === null ? null : first - started;
  const decoding = first === null ? 0 : (ended - first) / 1000;
  const rate = tokens > 1 && decoding > 0 ? (tokens - 1) / decoding : null;
  const parts = [`${tokens} tokens`];
  parts.push(rate === null ? "– tok/s" : `${rate.toFixed(1)} tok/s`);
  parts.push(ttft === null ? "first token –" : `first token ${Math.round(ttft)} ms`);
  return parts.join(" · ");
}

async function reply() {
  const li = addMessage("assistant", "");
  const content = li.querySelector(".content");
  const meta = document.createElement("p");
  meta.className = "stats";
  li.append(meta);
  li.setAttribute("aria-busy", "true");
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let first = null;
  let chunks = 0;
  let usage = null;
  let text = "";
  let ending = "";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      signal: controller.signal,
      body: JSON.stringify({
        model: els.model.dataset.id || "default",
        messages,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: Number(els.maxTokens.value) || 256,
        temperature: Number(els.temperature.value),
      }),
    });
    if (!response.ok) throw new Error(await apiError(response));
    for await (const data of events(response.body)) {
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message);
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        const piece = (choice.delta && choice.delta.content) || "";
        if (piece) {
          if (first === null) first = performance.now();
          text += piece;
          content.textContent = text;
          chunks += 1;
        }
        if (choice.finish_reason === "length") ending = " · max tokens reached";
      }
      meta.textContent = stats(usage ? usage.completion_tokens : chunks, started, first, performance.now());
    }
  } catch (err) {
    if (err.name === "AbortError") {
      ending = " · stopped";
    } else {
      li.classList.add("failed");
      const note = document.createElement("p");
      note.className = "error-text";
      note.textContent = err.message;
      li.insertBefore(note, meta);
    }
  } finally {
    const tokens = usage ? usage.completion_tokens : chunks;
    meta.textContent = stats(tokens, started, first, performance.now()) + ending;
    li.removeAttribute("aria-busy");
    controller = null;
    setBusy(false);
  }
  if (text) messages.push({ role: "assistant", content: text });
  else messages.pop(); // no reply: the turn is not sent again, so that roles keep alternating
}

async function submit(event) {
  event.preventDefault();
  const text = els.prompt.value.trim();
  if (!text || controller) return;
  if (keyMissing(els.status)) return;
  els.prompt.value = "";
  messages.push({ role: "user", content: text });
  addMessage("user", text);
  els.status.textContent = "";
  await reply();
  els.prompt.focus();
}

async function loadModel() {
  if (keyMissing(els.model)) return;
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      els.model.textContent = response.status === 401 ? "Set the API key in Settings." : await apiError(response);
      if (response.status === 401) $("settings").open = true;
      return;
    }
    const body = await response.json();
    const model = body.data && body.data[0];
    if (model) {
      els.model.dataset.id = model.id;
      els.model.textContent = `Model: ${model.id}`;
    }
  } catch (err) {
    els.model.textContent = `The server did not answer: ${err.message}`;
  }
}

function remember(input, name) {
  const saved = localStorage.getItem(name);
  if (saved !== null) input.value = saved;
  input.addEventListener("change", () => {
    localStorage.setItem(name, input.value);
    if (input === els.key) loadModel();
  });
}

remember(els.key, STORE.key);
remember(els.maxTokens, STORE.maxTokens);
remember(els.temperature, STORE.temperature);
els.form.addEventListener("submit", submit);
els.stop.addEventListener("click", () => controller && controller.abort());
els.clear.addEventListener("click", () => {
  if (controller) controller.abort();
  messages.length = 0;
  els.log.replaceChildren();
  els.prompt.focus();
});
els.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    els.form.requestSubmit();
  }
});
loadModel();
